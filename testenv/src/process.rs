//! Child processes of the test environment. With `Lifetime::Process` the kernel kills them when
//! the test process dies, even by a panic or SIGKILL; with `Lifetime::Detached` they outlive it
//! (for `lanepool-testenv up`) and are stopped by pid.

use std::fs::File;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::sync::{LazyLock, Mutex};
use std::time::{Duration, Instant};

use crate::error::{Result, io};

/// How long the started processes live.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Lifetime {
    /// Killed with the process that started them.
    Process,
    /// Left running; stopped by `lanepool-testenv down`.
    Detached,
}

/// A started process and the file its output goes to.
#[derive(Debug)]
pub struct Process {
    pub name: String,
    pub child: Child,
    pub log: PathBuf,
}

type SpawnRequest = (Command, mpsc::Sender<std::io::Result<Child>>);

// PR_SET_PDEATHSIG fires when the *thread* that forked the child exits, and each test runs on a
// thread of its own. So children are forked from one thread that lives as long as the process.
static SPAWNER: LazyLock<Mutex<mpsc::Sender<SpawnRequest>>> = LazyLock::new(|| {
    let (requests, incoming) = mpsc::channel::<SpawnRequest>();
    std::thread::Builder::new()
        .name("testenv-spawner".into())
        .spawn(move || {
            for (mut command, reply) in incoming {
                let _ = reply.send(command.spawn());
            }
            // Keep the thread alive even if every sender is gone: its exit would kill children.
            loop {
                std::thread::park();
            }
        })
        .expect("starting the testenv spawner thread");
    Mutex::new(requests)
});

impl Process {
    /// Starts `program` with `args`, its output appended to `log`.
    pub fn start(
        name: &str,
        program: &Path,
        args: &[String],
        log: PathBuf,
        lifetime: Lifetime,
    ) -> Result<Self> {
        Self::start_with_env(name, program, args, &[], log, lifetime)
    }

    /// [`Self::start`], with `env` added to the inherited environment.
    pub fn start_with_env(
        name: &str,
        program: &Path,
        args: &[String],
        env: &[(&str, String)],
        log: PathBuf,
        lifetime: Lifetime,
    ) -> Result<Self> {
        let out = File::create(&log).map_err(io(format!("creating {}", log.display())))?;
        let err = out
            .try_clone()
            .map_err(io(format!("opening {}", log.display())))?;
        let mut command = Command::new(program);
        command
            .args(args)
            .envs(env.iter().map(|(k, v)| (*k, v.as_str())))
            .stdin(Stdio::null())
            .stdout(out)
            .stderr(err)
            .process_group(0);
        let child = match lifetime {
            Lifetime::Detached => command.spawn(),
            Lifetime::Process => {
                // SAFETY: prctl is async-signal-safe and touches no memory of the parent.
                unsafe {
                    command.pre_exec(|| {
                        if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL) != 0 {
                            return Err(std::io::Error::last_os_error());
                        }
                        Ok(())
                    });
                }
                let (reply, answer) = mpsc::channel();
                SPAWNER
                    .lock()
                    .unwrap_or_else(|poisoned| poisoned.into_inner())
                    .send((command, reply))
                    .map_err(|_| std::io::Error::other("the spawner thread is gone"))
                    .and_then(|()| {
                        answer
                            .recv()
                            .map_err(|_| std::io::Error::other("the spawner thread is gone"))?
                    })
            }
        }
        .map_err(io(format!("starting {name} ({})", program.display())))?;
        Ok(Self {
            name: name.into(),
            child,
            log,
        })
    }

    /// The last lines of the process's output, for error messages.
    pub fn log_tail(&self) -> String {
        log_tail(&self.log, 30)
    }

    /// Whether the process has exited.
    pub fn exited(&mut self) -> bool {
        !matches!(self.child.try_wait(), Ok(None))
    }

    /// SIGTERM, then SIGKILL after `grace`.
    pub fn stop(&mut self, grace: Duration) {
        terminate(self.child.id() as i32, grace);
        let _ = self.child.wait();
    }
}

impl Drop for Process {
    fn drop(&mut self) {
        if !self.exited() {
            self.stop(Duration::from_secs(5));
        }
    }
}

/// Whether a process with this pid exists and has not exited.
pub fn process_alive(pid: u32) -> bool {
    // SAFETY: signal 0 only checks that the process exists.
    unsafe { libc::kill(pid as i32, 0) == 0 && !is_zombie(pid as i32) }
}

/// Stops a process started by an earlier run, by pid.
pub fn terminate_pid(pid: u32, grace: Duration) {
    if process_alive(pid) {
        terminate(pid as i32, grace);
    }
}

/// Sends SIGTERM to `pid` and waits up to `grace` for it to go, then SIGKILL.
pub fn terminate(pid: i32, grace: Duration) {
    // SAFETY: kill(2) with a pid we started.
    unsafe { libc::kill(pid, libc::SIGTERM) };
    let deadline = Instant::now() + grace;
    while Instant::now() < deadline {
        // SAFETY: signal 0 only checks that the process exists.
        if unsafe { libc::kill(pid, 0) } != 0 || is_zombie(pid) {
            return;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    // SAFETY: as above.
    unsafe { libc::kill(pid, libc::SIGKILL) };
}

fn is_zombie(pid: i32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .map(|stat| {
            stat.rsplit(')')
                .next()
                .is_some_and(|rest| rest.trim_start().starts_with('Z'))
        })
        .unwrap_or(true)
}

/// The last `lines` lines of a log file.
pub fn log_tail(path: &Path, lines: usize) -> String {
    let text = std::fs::read_to_string(path).unwrap_or_default();
    let all: Vec<&str> = text.lines().collect();
    all[all.len().saturating_sub(lines)..].join("\n")
}

/// `program` on this machine's PATH.
pub(crate) fn which(program: &str) -> Option<PathBuf> {
    std::env::var_os("PATH").and_then(|paths| {
        std::env::split_paths(&paths)
            .map(|dir| dir.join(program))
            .find(|candidate| candidate.is_file())
    })
}
