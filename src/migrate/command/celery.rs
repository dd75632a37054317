//! `celery [global options] worker [options]` (Celery 5): the same command, without what
//! `configure(app)` now decides: the queues (`-Q`, taken from LANEPOOL_LANES), `-X`, the
//! concurrency (`-c`, LANEPOOL_SLOTS from spec.slotsPerWorker), `--autoscale` and
//! `--prefetch-multiplier` (1). Every other option of `worker` is kept as written.

use super::{Dropped, Framework, Recognised, Rewritten, split_attached};

/// Celery's options before the subcommand, and whether each takes a value.
const GLOBAL_OPTIONS: &[(&[&str], bool)] = &[
    (&["-A", "--app"], true),
    (&["-b", "--broker"], true),
    (&["--result-backend"], true),
    (&["--loader"], true),
    (&["--config"], true),
    (&["--workdir"], true),
    (&["-C", "--no-color"], false),
    (&["-q", "--quiet"], false),
    (&["--skip-checks"], false),
];

/// The most jobs a LanePool's worker may run at once (spec.slotsPerWorker).
const MOST_CONCURRENCY: i32 = crate::api::MOST_SLOTS_PER_WORKER;

/// `program` is `celery` (or `python -m celery`), `wrapper` what came before it, `rest` what
/// follows it.
pub fn rewrite(
    wrapper: &[String],
    program: &[String],
    rest: &[String],
) -> Result<Recognised, String> {
    let mut argv: Vec<String> = wrapper.iter().chain(program).cloned().collect();
    let program_words = argv.len();
    let mut app = None;
    let mut words = rest.iter();
    let subcommand = loop {
        let Some(word) = words.next() else {
            return Ok(Recognised::Unknown(
                "`celery` without a subcommand is not `celery worker`".into(),
            ));
        };
        if !word.starts_with('-') {
            break word;
        }
        let (name, attached) = split_attached(word, &["-A", "-b"]);
        let Some((_, takes_value)) = GLOBAL_OPTIONS
            .iter()
            .find(|(names, _)| names.contains(&name))
        else {
            return Err(format!(
                "celery option {name} (before `worker`) is not one of Celery 5's, so migrate \
                 cannot tell whether the word after it is the subcommand: remove it, or write it \
                 as {name}=VALUE if it takes one"
            ));
        };
        argv.push(word.clone());
        if *takes_value {
            let value = match attached {
                Some(value) => value.to_string(),
                None => {
                    let value = words
                        .next()
                        .ok_or_else(|| format!("celery option {name} needs a value"))?;
                    argv.push(value.clone());
                    value.clone()
                }
            };
            if matches!(name, "-A" | "--app") {
                app = Some(value);
            }
        }
    };
    if subcommand != "worker" {
        return Ok(Recognised::Unknown(format!(
            "`celery {subcommand}` is not `celery worker`"
        )));
    }
    argv.push(subcommand.clone());
    let mut queues = Vec::new();
    let mut dropped = Vec::new();
    let mut notes = Vec::new();
    let mut concurrency = None;
    while let Some(word) = words.next() {
        let (name, attached) = split_attached(word, &["-Q", "-X", "-c"]);
        let takes_value = matches!(
            name,
            "-Q" | "--queues"
                | "-X"
                | "--exclude-queues"
                | "-c"
                | "--concurrency"
                | "--autoscale"
                | "--prefetch-multiplier"
        );
        if !takes_value {
            if matches!(name, "-B" | "--beat") {
                notes.push(
                    "the worker runs Celery beat (-B), now in every worker of the pool: run beat \
                     as a Deployment of its own, or each worker sends every periodic task"
                        .into(),
                );
            }
            argv.push(word.clone());
            continue;
        }
        let value = match attached {
            Some(value) => value.to_string(),
            None => words
                .next()
                .ok_or_else(|| format!("celery worker option {name} needs a value"))?
                .clone(),
        };
        let written = format!("{name} {value}");
        match name {
            "-Q" | "--queues" => queues.extend(
                value
                    .split(',')
                    .map(str::trim)
                    .filter(|queue| !queue.is_empty())
                    .map(str::to_string),
            ),
            "-c" | "--concurrency" => {
                concurrency = Some(
                    value
                        .parse::<i32>()
                        .ok()
                        .filter(|n| (1..=MOST_CONCURRENCY).contains(n))
                        .ok_or_else(|| {
                            format!(
                                "celery worker option {written}: expected the jobs a worker runs \
                                 at once, from 1 to {MOST_CONCURRENCY}"
                            )
                        })?,
                );
            }
            "-X" | "--exclude-queues" => dropped.push(Dropped {
                option: written,
                why: "a worker takes exactly its lanes (LANEPOOL_LANES)".into(),
            }),
            "--autoscale" => dropped.push(Dropped {
                option: written,
                why: "each worker runs spec.slotsPerWorker jobs at once (LANEPOOL_SLOTS), and the \
                      operator sizes the pool in workers"
                    .into(),
            }),
            _ => dropped.push(Dropped {
                option: written,
                why: "configure(app) takes one job per slot (a prefetch multiplier of 1)".into(),
            }),
        }
    }
    Ok(Recognised::Known(Rewritten {
        framework: Framework::Celery,
        queues,
        argv,
        program_words,
        dropped,
        concurrency,
        redis_named: false,
        app,
        notes,
    }))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rewritten(line: &str) -> Rewritten {
        let words: Vec<String> = line.split_whitespace().map(str::to_string).collect();
        match rewrite(&[], &["celery".to_string()], &words) {
            Ok(Recognised::Known(rewritten)) => rewritten,
            other => panic!("{line}: {other:?}"),
        }
    }

    fn refused(line: &str) -> String {
        let words: Vec<String> = line.split_whitespace().map(str::to_string).collect();
        rewrite(&[], &["celery".to_string()], &words).expect_err(line)
    }

    #[test]
    fn the_queues_and_concurrency_leave_the_command_and_the_rest_stays_as_written() {
        let celery = rewritten(
            "-A proj --workdir /srv worker -Q urgent,batch -c 4 -n celery@%h --loglevel=INFO -O fair",
        );
        assert_eq!(celery.queues, ["urgent", "batch"]);
        assert_eq!(celery.concurrency, Some(4));
        assert_eq!(celery.app.as_deref(), Some("proj"));
        assert_eq!(
            celery.argv.join(" "),
            "celery -A proj --workdir /srv worker -n celery@%h --loglevel=INFO -O fair"
        );
        assert!(
            celery.dropped.is_empty() && celery.notes.is_empty(),
            "{celery:?}"
        );
    }

    #[test]
    fn an_app_named_worker_is_the_app_and_not_the_subcommand() {
        let celery = rewritten("-A worker worker --queues=urgent,batch --concurrency=2");
        assert_eq!(celery.app.as_deref(), Some("worker"));
        assert_eq!(celery.queues, ["urgent", "batch"]);
        assert_eq!(celery.concurrency, Some(2));
        assert_eq!(celery.argv.join(" "), "celery -A worker worker");
    }

    #[test]
    fn attached_values_repeated_queues_and_dropped_options_are_read() {
        let celery = rewritten(
            "--app=proj worker -Qurgent -Q batch -c8 --autoscale 10,3 --prefetch-multiplier 4 -X slow -B",
        );
        assert_eq!(celery.queues, ["urgent", "batch"]);
        assert_eq!(celery.concurrency, Some(8));
        let options: Vec<&str> = celery.dropped.iter().map(|d| d.option.as_str()).collect();
        assert_eq!(
            options,
            ["--autoscale 10,3", "--prefetch-multiplier 4", "-X slow"]
        );
        assert!(celery.notes[0].contains("beat"));
        assert_eq!(celery.argv.join(" "), "celery --app=proj worker -B");
    }

    #[test]
    fn a_worker_without_queues_has_none_and_other_subcommands_are_unknown() {
        assert!(rewritten("-A proj worker").queues.is_empty());
        let words: Vec<String> = ["-A", "proj", "flower"].map(String::from).to_vec();
        assert!(matches!(
            rewrite(&[], &["celery".to_string()], &words),
            Ok(Recognised::Unknown(why)) if why.contains("celery flower")
        ));
    }

    #[test]
    fn a_bad_concurrency_or_an_unknown_global_option_is_refused_naming_it() {
        assert!(refused("-A proj worker -c 0 -Q a,b").contains("-c 0"));
        assert!(refused("-A proj worker -Q").contains("-Q needs a value"));
        assert!(refused("--pidfile x -A proj worker").contains("--pidfile"));
    }
}
