//! A Prometheus answer as a lane's load: anything but one finite, non-negative value is
//! unavailable, never zero.

use super::decide::LaneLoad;

/// A query's answer as plain numbers, one per series, or the reason there is none.
pub type QueryAnswer = std::result::Result<Vec<f64>, String>;

/// Reads one number from a query's answer; anything but one finite, non-negative value is
/// unavailable, never zero.
pub fn single_value(what: &str, answer: &QueryAnswer) -> std::result::Result<f64, String> {
    match answer {
        Err(reason) => Err(format!("{what}: {reason}")),
        Ok(values) => match values.as_slice() {
            [] => Err(format!("{what}: the query returned no series")),
            [value] if value.is_nan() => Err(format!("{what}: the query returned NaN")),
            [value] if value.is_infinite() => Err(format!("{what}: the query returned {value}")),
            [value] if *value < 0.0 => Err(format!("{what}: the query returned {value} (< 0)")),
            [value] => Ok(*value),
            many => Err(format!(
                "{what}: the query returned {} series; it must return one (aggregate with sum or avg)",
                many.len()
            )),
        },
    }
}

/// A lane's load from its two answers. A job time of NaN or no series means no job finished
/// in the window: the fallback stands in, and with no arrivals no job time is needed.
pub fn lane_load(
    lane: &str,
    arrival_rate: &QueryAnswer,
    job_seconds: &QueryAnswer,
    job_seconds_fallback: Option<f64>,
) -> std::result::Result<LaneLoad, String> {
    let rate = single_value(&format!("lane {lane} arrival rate"), arrival_rate)?;
    let no_job_ran = match job_seconds {
        Ok(values) => values.is_empty() || (values.len() == 1 && values[0].is_nan()),
        Err(_) => false,
    };
    let job = if no_job_ran {
        if job_seconds_fallback.is_none() && rate > 0.0 {
            return Err(format!(
                "lane {lane} job time: no job finished in the query's window and jobTime.fallback is not set"
            ));
        }
        job_seconds_fallback
    } else {
        Some(single_value(&format!("lane {lane} job time"), job_seconds)?)
    };
    Ok(LaneLoad {
        arrival_rate: rate,
        recent_arrival_rate: None,
        job_seconds: job,
    })
}
