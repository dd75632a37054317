//! Which Prometheus servers a LanePool may name (`--allowed-prometheus-urls`): the operator sends
//! a pool's bearer token and headers to its URL, so a tenant who may create LanePools but not read
//! Secrets must not be able to point it anywhere. A URL is allowed when it has an allowed
//! prefix's scheme, host and port, and its path continues the prefix's path at a `/`.

use reqwest::Url;

/// The allowed URL prefixes; `None`: every URL is allowed (no list given).
#[derive(Clone, Debug, Default, PartialEq)]
pub struct AllowedUrls(Option<Vec<Url>>);

impl AllowedUrls {
    /// Every URL.
    pub fn any() -> Self {
        Self(None)
    }

    /// Parses comma-separated prefixes, such as `http://prometheus.monitoring:9090,https://x/`.
    pub fn parse(list: &str) -> Result<Self, String> {
        let prefixes = list
            .split(',')
            .map(str::trim)
            .filter(|p| !p.is_empty())
            .map(|p| {
                let url = Url::parse(p).map_err(|e| format!("{p:?}: {e}"))?;
                match url.scheme() {
                    "http" | "https" if url.host().is_some() => Ok(url),
                    _ => Err(format!("{p:?} is not an http(s) URL with a host")),
                }
            })
            .collect::<Result<Vec<_>, _>>()?;
        if prefixes.is_empty() {
            return Err("no URL given".into());
        }
        Ok(Self(Some(prefixes)))
    }

    /// Whether a pool may use `url`.
    pub fn allows(&self, url: &str) -> bool {
        let Some(prefixes) = &self.0 else {
            return true;
        };
        let Ok(url) = Url::parse(url) else {
            return false;
        };
        prefixes.iter().any(|prefix| {
            url.scheme() == prefix.scheme()
                && url.host() == prefix.host()
                && url.port_or_known_default() == prefix.port_or_known_default()
                && url.username().is_empty()
                && url.password().is_none()
                && path_continues(prefix.path(), url.path())
        })
    }

    /// The prefixes as written for messages, or "any".
    /// Whether the installer named `url` for credentials: this list allows it, or without a
    /// list, it lies under the operator's own `default` URL (`--prometheus-url`). Without either,
    /// no URL is named, and credentials go nowhere.
    pub fn names_for_credentials(&self, url: &str, default: Option<&str>) -> bool {
        match &self.0 {
            Some(_) => self.allows(url),
            None => default
                .and_then(|default| Self::parse(default).ok())
                .is_some_and(|own| own.allows(url)),
        }
    }

    pub fn describe(&self) -> String {
        match &self.0 {
            None => "any URL".into(),
            Some(prefixes) => prefixes
                .iter()
                .map(Url::as_str)
                .collect::<Vec<_>>()
                .join(", "),
        }
    }
}

/// `/prom` continues into `/prom` and `/prom/api`, not `/prometheus`.
fn path_continues(prefix: &str, path: &str) -> bool {
    let prefix = prefix.trim_end_matches('/');
    path == prefix || path.starts_with(&format!("{prefix}/")) || prefix.is_empty()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn without_a_list_credentials_go_only_under_the_operators_own_url() {
        let own = Some("http://prometheus.monitoring:9090");
        let any = AllowedUrls::any();
        assert!(any.names_for_credentials("http://prometheus.monitoring:9090/api", own));
        assert!(!any.names_for_credentials("https://elsewhere.example", own));
        assert!(!any.names_for_credentials("https://prometheus.monitoring:9090", None));
        let listed = AllowedUrls::parse("https://metrics.example/prom").unwrap();
        assert!(listed.names_for_credentials("https://metrics.example/prom/x", None));
        assert!(!listed.names_for_credentials("http://prometheus.monitoring:9090", own));
    }

    #[test]
    fn a_prefix_allows_its_server_and_paths_below_it_only() {
        let allowed =
            AllowedUrls::parse("http://prometheus.monitoring:9090, https://metrics.example/prom")
                .unwrap();
        for ok in [
            "http://prometheus.monitoring:9090",
            "http://prometheus.monitoring:9090/",
            "http://prometheus.monitoring:9090/api/x",
            "https://metrics.example/prom",
            "https://metrics.example:443/prom/tenant-a",
        ] {
            assert!(allowed.allows(ok), "{ok} was refused");
        }
        for refused in [
            "http://prometheus.monitoring:9091",
            "http://prometheus.monitoring:9090.evil.example",
            "http://prometheus.monitoring.evil.example:9090",
            "https://prometheus.monitoring:9090",
            "http://evil.example/?u=http://prometheus.monitoring:9090",
            "http://user:secret@prometheus.monitoring:9090",
            "https://metrics.example/prometheus",
            "https://metrics.example/",
            "http://169.254.169.254/computeMetadata/v1/",
            "not a url",
        ] {
            assert!(!allowed.allows(refused), "{refused} was allowed");
        }
    }

    #[test]
    fn no_list_allows_any_and_a_bad_list_is_refused_naming_the_entry() {
        assert!(AllowedUrls::any().allows("http://anything:1"));
        assert!(AllowedUrls::parse("").is_err());
        let error = AllowedUrls::parse("http://ok:9090,ftp://x").unwrap_err();
        assert!(error.contains("ftp://x"), "{error}");
    }
}
