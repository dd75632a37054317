//! A worker's command, recognised and rewritten for a LanePool: `rq worker [options] q1 q2 …`
//! becomes `lanepool-rq-worker` with the options that map, and `celery … worker -Q a,b` the same
//! celery command without the queues (`configure(app)` takes LANEPOOL_LANES). Pure: words in,
//! words out. It never guesses whether an option it does not know takes a value, since that
//! decides which words are queues.

pub mod celery;
pub mod rq;

/// The queue systems whose workers migrate rewrites.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Framework {
    Rq,
    Celery,
}

impl Framework {
    pub fn name(self) -> &'static str {
        match self {
            Self::Rq => "RQ",
            Self::Celery => "Celery",
        }
    }
}

/// A worker command rewritten for a LanePool's workers.
#[derive(Clone, Debug, PartialEq)]
pub struct Rewritten {
    pub framework: Framework,
    /// The queues the old command took, in its order; for `rq worker` without any, RQ's
    /// `default`; empty for a Celery worker without `-Q` (it takes every queue of its app).
    pub queues: Vec<String>,
    /// The new command line, wrapper (such as `ddtrace-run`) included.
    pub argv: Vec<String>,
    /// How many leading words of `argv` run the program (`lanepool-rq-worker`, `celery`,
    /// `python -m celery`, after a wrapper): they become the container's `command`.
    pub program_words: usize,
    /// Options of the old command that the new one does not take.
    pub dropped: Vec<Dropped>,
    /// Celery's `--concurrency`: the jobs one worker ran at once.
    pub concurrency: Option<i32>,
    /// RQ: whether the command named its Redis (`--url`) or an RQ settings module (`--config`).
    pub redis_named: bool,
    /// Celery: the app (`-A`), for the line to add to it.
    pub app: Option<String>,
    /// What else changes with the new command, one sentence each.
    pub notes: Vec<String>,
}

/// An option left out of the new command, as it was written, and what leaving it out changes.
#[derive(Clone, Debug, PartialEq)]
pub struct Dropped {
    pub option: String,
    pub why: String,
}

/// What migrate makes of a command line.
#[derive(Clone, Debug, PartialEq)]
pub enum Recognised {
    Known(Rewritten),
    /// Neither an RQ nor a Celery worker: why not, in words.
    Unknown(String),
}

/// Recognises `argv` (the container's command followed by its args). An `Err` is a command
/// that is an RQ or Celery worker but cannot be read with certainty (an option migrate does not
/// know, a value missing): the message names the option.
pub fn recognise(argv: &[String]) -> Result<Recognised, String> {
    let Some(first) = argv.first() else {
        return Ok(Recognised::Unknown(
            "the container sets neither command nor args, so the image's own entrypoint runs, \
             which migrate cannot read"
                .into(),
        ));
    };
    if is_shell(first) && argv.get(1).is_some_and(|word| word == "-c") {
        return Ok(Recognised::Unknown(
            "it is a shell script (sh -c …), which migrate does not read: write the worker's \
             command as a list (command: [rq, worker, …]) and migrate again"
                .into(),
        ));
    }
    for at in 0..argv.len() {
        let Some(program) = program_at(argv, at) else {
            continue;
        };
        let starts = at - program.python_words;
        let (wrapper, rest) = (&argv[..starts], &argv[at + 1..]);
        return match program.framework {
            Framework::Rq => rq::rewrite(wrapper, rest),
            Framework::Celery => celery::rewrite(wrapper, &argv[starts..=at], rest),
        };
    }
    Ok(Recognised::Unknown(format!(
        "{} is neither `rq worker` nor `celery … worker`",
        shown(argv)
    )))
}

/// A queue system's program at `argv[at]`: `rq`, `celery` (any directory), or the module of
/// `python -m rq.cli` / `python -m celery`, whose two words before it belong to it.
struct Program {
    framework: Framework,
    python_words: usize,
}

fn program_at(argv: &[String], at: usize) -> Option<Program> {
    let word = argv[at].as_str();
    let by_module = at >= 2 && argv[at - 1] == "-m" && is_python(&argv[at - 2]);
    let framework = match (basename(word), by_module) {
        ("rq", false) | ("rq.cli", true) => Framework::Rq,
        ("celery", _) => Framework::Celery,
        _ => return None,
    };
    Some(Program {
        framework,
        python_words: if by_module { 2 } else { 0 },
    })
}

fn basename(word: &str) -> &str {
    word.rsplit('/').next().unwrap_or(word)
}

fn is_python(word: &str) -> bool {
    let name = basename(word);
    name == "python"
        || name
            .strip_prefix("python3")
            .is_some_and(|minor| minor.is_empty() || minor.starts_with('.'))
}

fn is_shell(word: &str) -> bool {
    matches!(basename(word), "sh" | "bash" | "dash" | "ash" | "zsh")
}

/// A command line as one would type it, for messages.
pub fn shown(argv: &[String]) -> String {
    let words: Vec<String> = argv
        .iter()
        .map(|word| {
            if !word.is_empty()
                && word
                    .chars()
                    .all(|c| c.is_ascii_alphanumeric() || "-_./:=,@$()".contains(c))
            {
                word.clone()
            } else {
                format!("'{}'", word.replace('\'', r"'\''"))
            }
        })
        .collect();
    format!("`{}`", words.join(" "))
}

/// An option's name and a value written into it (`--url=redis://…`, `-Q` of `-Qurgent`), or
/// the word alone.
pub(super) fn split_attached<'w>(
    word: &'w str,
    shorts_with_value: &[&str],
) -> (&'w str, Option<&'w str>) {
    if word.starts_with("--") {
        return match word.split_once('=') {
            Some((name, value)) => (name, Some(value)),
            None => (word, None),
        };
    }
    for short in shorts_with_value {
        if word.len() > short.len() && word.starts_with(short) {
            return (&word[..short.len()], Some(&word[short.len()..]));
        }
    }
    (word, None)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn words(line: &str) -> Vec<String> {
        line.split_whitespace().map(str::to_string).collect()
    }

    fn known(line: &str) -> Rewritten {
        match recognise(&words(line)) {
            Ok(Recognised::Known(rewritten)) => rewritten,
            other => panic!("{line}: {other:?}"),
        }
    }

    fn unknown(line: &str) -> String {
        match recognise(&words(line)) {
            Ok(Recognised::Unknown(why)) => why,
            other => panic!("{line}: {other:?}"),
        }
    }

    #[test]
    fn rq_and_celery_are_found_after_a_wrapper_a_directory_or_python_dash_m() {
        assert_eq!(
            known("/usr/local/bin/rq worker a b").framework,
            Framework::Rq
        );
        let wrapped = known("ddtrace-run rq worker a b");
        assert_eq!(wrapped.argv[..2], words("ddtrace-run lanepool-rq-worker"));
        assert_eq!(wrapped.program_words, 2);
        let module = known("python3 -m rq.cli worker a b");
        assert_eq!(module.argv[0], "lanepool-rq-worker");
        let celery = known("python -m celery -A app worker -Q a,b");
        assert_eq!(celery.argv[..3], words("python -m celery"));
        assert_eq!(celery.program_words, 3);
        assert_eq!(
            known("tini -- celery -A app worker -Q a,b").program_words,
            3
        );
    }

    #[test]
    fn other_commands_are_unknown_and_say_why() {
        assert!(unknown("python worker.py").contains("neither `rq worker` nor `celery … worker`"));
        assert!(unknown("sh -c rq_worker_urgent_batch").contains("shell script"));
        assert!(unknown("").contains("entrypoint"));
        assert!(unknown("celery -A app beat").contains("celery beat"));
        assert!(unknown("rq info").contains("rq info"));
    }

    #[test]
    fn shown_quotes_only_what_a_shell_would_split() {
        assert_eq!(
            shown(&words("rq worker --url redis://r:6379/0 urgent")),
            "`rq worker --url redis://r:6379/0 urgent`"
        );
        assert_eq!(shown(&["a b".to_string()]), "`'a b'`");
    }
}
