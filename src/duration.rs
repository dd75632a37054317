//! Durations written the Kubernetes way ("5s", "30s", "5m", "1h30m", "0"), kept as the user wrote
//! them so a LanePool round-trips unchanged. The CRD checks the syntax; parsing here must agree
//! with it and must never turn a malformed value into zero.

use std::sync::LazyLock;
use std::{borrow::Cow, fmt, time::Duration};

use regex::Regex;

use schemars::{JsonSchema, Schema, SchemaGenerator, json_schema};
use serde::{Deserialize, Serialize};

/// The pattern the CRD enforces; the same grammar Go's `time.ParseDuration` accepts for
/// non-negative values, minus the rarely used `ns`/`us` units.
pub const PATTERN: &str = r"^(0|([0-9]+(\.[0-9]+)?(ms|s|m|h))+)$";

/// A duration in Kubernetes notation, such as `30s` or `1h30m`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(transparent)]
pub struct KubeDuration(String);

/// Why a duration string could not be read.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{value:?} is not a duration such as \"500ms\", \"30s\", \"5m\" or \"1h30m\"")]
pub struct InvalidDuration {
    pub value: String,
}

impl KubeDuration {
    pub fn new(value: impl Into<String>) -> Self {
        Self(value.into())
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }

    /// The duration this string denotes.
    pub fn get(&self) -> Result<Duration, InvalidDuration> {
        parse(&self.0)
    }
}

impl fmt::Display for KubeDuration {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl From<&str> for KubeDuration {
    fn from(value: &str) -> Self {
        Self::new(value)
    }
}

impl JsonSchema for KubeDuration {
    fn schema_name() -> Cow<'static, str> {
        "KubeDuration".into()
    }

    fn inline_schema() -> bool {
        true
    }

    fn json_schema(_: &mut SchemaGenerator) -> Schema {
        json_schema!({
            "type": "string",
            "pattern": PATTERN,
            "maxLength": 32,
        })
    }
}

/// Parses `1h30m`, `250ms`, `1.5s` or `0`: the CRD's [`PATTERN`] decides what is a duration,
/// kube-core's Go-style duration parser what it means.
pub fn parse(value: &str) -> Result<Duration, InvalidDuration> {
    static GRAMMAR: LazyLock<Regex> =
        LazyLock::new(|| Regex::new(PATTERN).expect("the CRD's duration pattern compiles"));
    let invalid = || InvalidDuration {
        value: value.to_string(),
    };
    if !GRAMMAR.is_match(value) {
        return Err(invalid());
    }
    let go: kube::core::Duration = value.parse().map_err(|_| invalid())?;
    Ok(go.into())
}

/// [`parse`] as a clap `value_parser`: the error as text, for clap to name the flag.
pub fn flag(value: &str) -> Result<Duration, String> {
    parse(value).map_err(|e| e.to_string())
}

/// A clap `value_parser` for a duration of at least `least`.
pub fn at_least(least: Duration) -> impl Fn(&str) -> Result<Duration, String> + Clone {
    move |value| match flag(value)? {
        d if d >= least && !d.is_zero() => Ok(d),
        _ if least.is_zero() => Err("must be more than 0".into()),
        _ => Err(format!(
            "must be at least {}",
            human_seconds(least.as_secs_f64())
        )),
    }
}

/// A clap `value_parser` for a PromQL range such as `30s`, `1m` or `5m`: a whole number (more
/// than 0) of seconds, minutes or hours, kept as written for the query.
pub fn promql_window(value: &str) -> Result<String, String> {
    static WINDOW: LazyLock<Regex> =
        LazyLock::new(|| Regex::new("^[1-9][0-9]*[smh]$").expect("the window pattern compiles"));
    if WINDOW.is_match(value) {
        Ok(value.to_string())
    } else {
        Err(format!("{value:?} is not a window such as 30s, 1m or 5m"))
    }
}

/// Formats seconds the way the guide writes job times: "20 ms", "1.5 s".
pub fn human_seconds(seconds: f64) -> String {
    if seconds < 1.0 {
        format!("{} ms", trim(seconds * 1e3))
    } else {
        format!("{} s", trim(seconds))
    }
}

/// A whole-second duration the way a LanePool spells one: "45s", "10m", "1h30m".
pub fn compact(duration: Duration) -> String {
    let total = duration.as_secs();
    let (hours, minutes, seconds) = (total / 3600, total / 60 % 60, total % 60);
    let mut text = String::new();
    for (value, unit) in [(hours, "h"), (minutes, "m"), (seconds, "s")] {
        if value > 0 {
            text.push_str(&format!("{value}{unit}"));
        }
    }
    if text.is_empty() { "0s".into() } else { text }
}

/// Three significant figures at most, without trailing zeros: 20, 20.4, 0.95, 1490.
pub fn trim(value: f64) -> String {
    if value == 0.0 || !value.is_finite() {
        return format!("{value}");
    }
    let magnitude = value.abs().log10().floor() as i32;
    let decimals = (2 - magnitude).clamp(0, 6) as usize;
    let text = format!("{value:.decimals$}");
    if text.contains('.') {
        text.trim_end_matches('0').trim_end_matches('.').to_string()
    } else {
        text
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn compact_durations_read_as_a_spec_writes_them() {
        assert_eq!(compact(Duration::from_secs(600)), "10m");
        assert_eq!(compact(Duration::from_secs(5400)), "1h30m");
        assert_eq!(compact(Duration::from_secs(45)), "45s");
        assert_eq!(compact(Duration::ZERO), "0s");
    }

    #[test]
    fn parses_the_kubernetes_forms() {
        assert_eq!(parse("5s"), Ok(Duration::from_secs(5)));
        assert_eq!(parse("30s"), Ok(Duration::from_secs(30)));
        assert_eq!(parse("5m"), Ok(Duration::from_secs(300)));
        assert_eq!(parse("1h30m"), Ok(Duration::from_secs(5400)));
        assert_eq!(parse("250ms"), Ok(Duration::from_millis(250)));
        assert_eq!(parse("1.5s"), Ok(Duration::from_millis(1500)));
        assert_eq!(parse("0"), Ok(Duration::ZERO));
        assert_eq!(parse("0s"), Ok(Duration::ZERO));
        assert_eq!(parse("1h0m0.5s"), Ok(Duration::from_millis(3_600_500)));
    }

    #[test]
    fn flags_name_their_bound() {
        assert_eq!(
            at_least(Duration::ZERO)("0"),
            Err("must be more than 0".into())
        );
        assert_eq!(
            at_least(Duration::from_secs(2))("1s"),
            Err("must be at least 2 s".into())
        );
        assert_eq!(
            at_least(Duration::from_secs(2))("2s"),
            Ok(Duration::from_secs(2))
        );
        assert!(flag("5x").unwrap_err().contains("is not a duration"));
        assert_eq!(promql_window("1m"), Ok("1m".into()));
        for bad in ["0m", "1.5m", "1ms", "90", "m", "01m", "1h30m"] {
            assert!(promql_window(bad).is_err(), "{bad:?} was accepted");
        }
    }

    #[test]
    fn refuses_what_the_crd_pattern_refuses() {
        for bad in [
            "", "5", "s", "5x", "-5s", "+5s", "5 s", ".5s", "5.s", "1h30", "1d", "5us", "5ns",
            "5µs",
        ] {
            assert!(parse(bad).is_err(), "{bad:?} was accepted");
        }
    }

    #[test]
    fn formats_job_times_like_the_guide() {
        assert_eq!(human_seconds(0.02), "20 ms");
        assert_eq!(human_seconds(0.0204), "20.4 ms");
        assert_eq!(human_seconds(1.5), "1.5 s");
        assert_eq!(trim(0.9000000000000001), "0.9");
        assert_eq!(trim(31.26), "31.3");
        assert_eq!(trim(1490.0), "1490");
    }
}
