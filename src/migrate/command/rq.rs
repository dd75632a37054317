//! `rq worker [options] q1 q2 …` (RQ 3.0's options) as `lanepool-rq-worker`: `--url`, `--path`,
//! `--name`, `--logging_level` and the worker class carry over; the queues become the lanes
//! (LANEPOOL_LANES); every other option is dropped and named with what that changes.

use super::{Dropped, Framework, Recognised, Rewritten, split_attached};

/// The entry point of the Python package's RQ worker (python/pyproject.toml).
pub const ENTRY_POINT: &str = "lanepool-rq-worker";

/// The queue `rq worker` takes when it names none.
const DEFAULT_QUEUE: &str = "default";

/// What becomes of an option of `rq worker`.
#[derive(Clone, Copy)]
enum Becomes {
    /// The same option of lanepool-rq-worker (under this name).
    Same(&'static str),
    WorkerClass,
    /// Names the Redis through an RQ settings module: dropped, and the Redis URL is then to set.
    Config,
    Dropped(&'static str),
}

struct RqOption {
    names: &'static [&'static str],
    takes_value: bool,
    becomes: Becomes,
}

const fn value(names: &'static [&'static str], becomes: Becomes) -> RqOption {
    RqOption {
        names,
        takes_value: true,
        becomes,
    }
}

const fn flag(names: &'static [&'static str], why: &'static str) -> RqOption {
    RqOption {
        names,
        takes_value: false,
        becomes: Becomes::Dropped(why),
    }
}

/// Every option of `rq worker` in RQ 3.0 (rq/cli/workers.py and helpers.py's shared options).
const OPTIONS: &[RqOption] = &[
    value(&["--url", "-u"], Becomes::Same("--url")),
    value(&["--path", "-P"], Becomes::Same("--path")),
    value(&["--name", "-n"], Becomes::Same("--name")),
    value(&["--logging_level"], Becomes::Same("--logging-level")),
    value(&["--worker-class", "-w"], Becomes::WorkerClass),
    value(&["--config", "-c"], Becomes::Config),
    value(
        &["--serializer", "-S"],
        Becomes::Dropped(
            "jobs are read with RQ's default serializer (pickle): a job enqueued with another one fails",
        ),
    ),
    value(
        &["--job-class", "-j"],
        Becomes::Dropped("jobs are RQ's own Job class"),
    ),
    value(
        &["--queue-class"],
        Becomes::Dropped("queues are RQ's own Queue class"),
    ),
    value(
        &["--connection-class"],
        Becomes::Dropped("the Redis client is redis-py's Redis"),
    ),
    value(
        &["--log-format", "--date-format"],
        Becomes::Dropped("lanepool-rq-worker logs in its own format"),
    ),
    value(
        &[
            "--results-ttl",
            "--worker-ttl",
            "--maintenance-interval",
            "--job-monitoring-interval",
        ],
        Becomes::Dropped("RQ's default is used"),
    ),
    value(
        &["--exception-handler"],
        Becomes::Dropped("a failed job goes to RQ's failed job registry only"),
    ),
    value(&["--pid"], Becomes::Dropped("no PID file is written")),
    value(
        &["--max-jobs", "--max-idle-time"],
        Becomes::Dropped(
            "a pool's worker runs until the operator stops it (a fork per job, --worker-class fork, frees each job's memory)",
        ),
    ),
    value(
        &["--dequeue-strategy", "-ds"],
        Becomes::Dropped("the lanes are taken in strict priority order"),
    ),
    flag(
        &["--burst", "-b"],
        "a pool's worker runs until the operator stops it",
    ),
    flag(
        &["--with-scheduler", "-s"],
        "no RQ scheduler runs in the pool: jobs enqueued with enqueue_at or enqueue_in wait until a worker started with --with-scheduler serves their queue",
    ),
    flag(
        &[
            "--verbose",
            "-v",
            "--quiet",
            "-q",
            "--disable-job-desc-logging",
        ],
        "the log level is --logging-level",
    ),
    flag(
        &["--disable-default-exception-handler", "-d"],
        "a failed job goes to RQ's failed job registry, as by default",
    ),
];

/// The short options that take a value, longest first, so `-dsround_robin` is `-ds`.
const SHORTS_WITH_VALUE: &[&str] = &["-ds", "-u", "-P", "-n", "-w", "-c", "-S", "-j"];

/// `rest` is what follows `rq` (or `python -m rq.cli`); `wrapper` what came before it.
pub fn rewrite(wrapper: &[String], rest: &[String]) -> Result<Recognised, String> {
    match rest.first().map(String::as_str) {
        Some("worker") => {}
        Some(other) => {
            return Ok(Recognised::Unknown(format!(
                "`rq {other}` is not `rq worker`{}",
                if other == "worker-pool" {
                    " (a worker pool runs several workers in one Pod; lanepool-rq-worker runs one: \
                     run as many more Pods instead)"
                } else {
                    ""
                }
            )));
        }
        None => return Ok(Recognised::Unknown("`rq` alone is not `rq worker`".into())),
    }
    let mut argv: Vec<String> = wrapper.to_vec();
    argv.push(ENTRY_POINT.into());
    let program_words = argv.len();
    let mut queues = Vec::new();
    let mut dropped = Vec::new();
    let mut notes = Vec::new();
    let mut worker_class = None;
    let mut redis_named = false;
    let mut words = rest[1..].iter();
    let mut options_end = false;
    while let Some(word) = words.next() {
        if options_end || !word.starts_with('-') || word == "-" {
            queues.push(word.clone());
            continue;
        }
        if word == "--" {
            options_end = true;
            continue;
        }
        let (name, attached) = split_attached(word, SHORTS_WITH_VALUE);
        let Some(option) = OPTIONS.iter().find(|o| o.names.contains(&name)) else {
            return Err(format!(
                "rq worker option {name} is not one of RQ 3.0's, so migrate cannot tell whether \
                 the word after it is a queue: remove it, or write it as {name}=VALUE if it takes one"
            ));
        };
        let value = match (option.takes_value, attached) {
            (true, Some(value)) => Some(value.to_string()),
            (true, None) => Some(
                words
                    .next()
                    .ok_or_else(|| format!("rq worker option {name} needs a value"))?
                    .clone(),
            ),
            (false, None) => None,
            (false, Some(_)) => return Err(format!("rq worker option {name} takes no value")),
        };
        let written = match &value {
            Some(value) => format!("{name} {value}"),
            None => name.to_string(),
        };
        match option.becomes {
            Becomes::Same(new) => {
                redis_named |= new == "--url";
                argv.push(new.into());
                argv.extend(value);
            }
            Becomes::WorkerClass => worker_class = value,
            Becomes::Config => {
                redis_named = true;
                dropped.push(Dropped {
                    option: written,
                    why: "lanepool-rq-worker reads no RQ settings module: its REDIS_URL is to be \
                          given as --url or LANEPOOL_REDIS_URL, and its other settings are not read"
                        .into(),
                });
            }
            Becomes::Dropped(why) => dropped.push(Dropped {
                option: written,
                why: why.into(),
            }),
        }
    }
    match worker_class.as_deref() {
        Some("rq.SimpleWorker" | "rq.worker.SimpleWorker") => {}
        Some("rq.Worker" | "rq.worker.Worker") => argv.extend(fork()),
        None => {
            argv.extend(fork());
            notes.push(
                "RQ's default worker forks a child per job; kept as --worker-class fork. \
                 lanepool-rq-worker's own default (simple, each job in the worker's process) \
                 runs 4 to 5 times as many short jobs a second, and urgent ones wait less \
                 (docs/workers.md#rq): drop \
                 `--worker-class fork` once your jobs allow it (no memory kept between jobs, no \
                 crash that must stay in a child)"
                    .into(),
            );
        }
        Some(other) => {
            argv.extend(fork());
            dropped.push(Dropped {
                option: format!("--worker-class {other}"),
                why: "lanepool-rq-worker runs its own subclass of RQ's Worker (--worker-class \
                      fork): what this class adds does not run"
                    .into(),
            });
        }
    }
    if queues.is_empty() {
        queues.push(DEFAULT_QUEUE.into());
    }
    Ok(Recognised::Known(Rewritten {
        framework: Framework::Rq,
        queues,
        argv,
        program_words,
        dropped,
        concurrency: None,
        redis_named,
        app: None,
        notes,
    }))
}

fn fork() -> [String; 2] {
    ["--worker-class".into(), "fork".into()]
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rewritten(line: &str) -> Rewritten {
        let words: Vec<String> = line.split_whitespace().map(str::to_string).collect();
        match rewrite(&[], &words) {
            Ok(Recognised::Known(rewritten)) => rewritten,
            other => panic!("{line}: {other:?}"),
        }
    }

    fn refused(line: &str) -> String {
        let words: Vec<String> = line.split_whitespace().map(str::to_string).collect();
        rewrite(&[], &words).expect_err(line)
    }

    #[test]
    fn the_queues_in_order_become_the_lanes_and_the_mapped_options_carry_over() {
        let rq = rewritten(
            "worker --url redis://redis:6379/0 -P /app --path=/lib -w rq.worker.SimpleWorker \
             --logging_level DEBUG urgent batch",
        );
        assert_eq!(rq.queues, ["urgent", "batch"]);
        assert_eq!(
            rq.argv.join(" "),
            "lanepool-rq-worker --url redis://redis:6379/0 --path /app --path /lib \
             --logging-level DEBUG"
        );
        assert_eq!(rq.program_words, 1);
        assert!(rq.redis_named);
        assert!(rq.dropped.is_empty() && rq.notes.is_empty(), "{rq:?}");
    }

    #[test]
    fn rqs_default_forking_worker_is_kept_and_said() {
        let rq = rewritten("worker urgent batch");
        assert_eq!(rq.argv.join(" "), "lanepool-rq-worker --worker-class fork");
        assert!(rq.notes[0].contains("forks a child per job"), "{rq:?}");
        assert!(!rq.redis_named);
        let custom = rewritten("worker -w myapp.workers.Sentried urgent batch");
        assert_eq!(
            custom.argv.join(" "),
            "lanepool-rq-worker --worker-class fork"
        );
        assert_eq!(
            custom.dropped[0].option,
            "--worker-class myapp.workers.Sentried"
        );
    }

    #[test]
    fn options_without_a_counterpart_are_dropped_and_named_with_their_value() {
        let rq = rewritten(
            "worker --with-scheduler -S rq.serializers.JSONSerializer -dsround_robin --max-jobs=100 -c settings urgent batch",
        );
        assert_eq!(rq.queues, ["urgent", "batch"]);
        let options: Vec<&str> = rq.dropped.iter().map(|d| d.option.as_str()).collect();
        assert_eq!(
            options,
            [
                "--with-scheduler",
                "-S rq.serializers.JSONSerializer",
                "-ds round_robin",
                "--max-jobs 100",
                "-c settings"
            ]
        );
        assert!(rq.dropped[1].why.contains("pickle"));
        assert!(rq.redis_named, "a settings module may name the Redis");
    }

    #[test]
    fn no_queue_is_rqs_default_queue_and_a_double_dash_ends_the_options() {
        assert_eq!(rewritten("worker").queues, ["default"]);
        assert_eq!(rewritten("worker -- -odd").queues, ["-odd"]);
    }

    #[test]
    fn an_unknown_option_or_a_missing_value_is_refused_naming_it() {
        assert!(refused("worker --sentry-dsn x urgent").contains("--sentry-dsn"));
        assert!(refused("worker urgent --url").contains("--url needs a value"));
        assert!(refused("worker --burst=yes urgent").contains("--burst takes no value"));
    }
}
