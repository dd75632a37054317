//! A real Redis (Debian's `redis-server`) on 127.0.0.1, the broker of the RQ and Celery workers in
//! the tests and the demo, with its own port and directory and nothing saved to disk. It can be
//! stopped and started again on the same port, so tests can restart the broker mid-run. It must
//! never outlive the process that started it ([`Lifetime::Process`]).

use std::io::{BufRead, BufReader, Write};
use std::net::{SocketAddr, TcpStream};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use super::process::{Lifetime, Process, which};
use crate::error::{Result, TestEnvError, io};
use crate::wait::free_port;

const READY_TIMEOUT: Duration = Duration::from_secs(20);
/// The largest bulk reply [`TestRedis::command`] reads: tests count and list, never dump.
const MOST_REPLY_BYTES: usize = 16 << 20;

/// A Redis server on 127.0.0.1.
pub struct TestRedis {
    process: Option<Process>,
    args: Vec<String>,
    dir: PathBuf,
    port: u16,
    lifetime: Lifetime,
    _temp: Option<tempfile::TempDir>,
}

/// One RESP reply.
#[derive(Clone, Debug, PartialEq)]
pub enum Reply {
    Status(String),
    Error(String),
    Integer(i64),
    Bulk(Option<String>),
    Array(Vec<Reply>),
}

impl Reply {
    /// The integer of an `:n` reply (LLEN, SCARD, INCR…); `None` for any other.
    pub fn integer(&self) -> Option<i64> {
        match self {
            Reply::Integer(n) => Some(*n),
            _ => None,
        }
    }
}

impl TestRedis {
    /// Starts Redis in a directory of its own, removed with it.
    pub fn start() -> Result<Self> {
        let temp = tempfile::Builder::new()
            .prefix("lanepool-redis-")
            .tempdir()
            .map_err(io("creating Redis's directory"))?;
        let mut redis = Self::start_in(temp.path(), Lifetime::Process)?;
        redis._temp = Some(temp);
        Ok(redis)
    }

    /// Starts Redis with its directory `dir`, on a free port.
    pub fn start_in(dir: &Path, lifetime: Lifetime) -> Result<Self> {
        Self::start_on(dir, free_port()?, lifetime)
    }

    /// Starts Redis in a directory of its own, listening on 127.0.0.1 and on `host` too, so
    /// the Pods of a real node reach it there ([`Self::url_at`]).
    pub fn start_reachable_at(host: std::net::IpAddr) -> Result<Self> {
        let temp = tempfile::Builder::new()
            .prefix("lanepool-redis-")
            .tempdir()
            .map_err(io("creating Redis's directory"))?;
        let bind = format!("127.0.0.1 {host}");
        let mut redis = Self::start_bound(temp.path(), free_port()?, &bind, Lifetime::Process)?;
        redis._temp = Some(temp);
        Ok(redis)
    }

    /// Starts Redis with its directory `dir`, on `port`.
    pub fn start_on(dir: &Path, port: u16, lifetime: Lifetime) -> Result<Self> {
        Self::start_bound(dir, port, "127.0.0.1", lifetime)
    }

    /// Starts Redis with its directory `dir`, on `port` of the addresses `bind` (space
    /// separated); any other than loopback turns protected mode off, which would refuse every
    /// client there.
    fn start_bound(dir: &Path, port: u16, bind: &str, lifetime: Lifetime) -> Result<Self> {
        std::fs::create_dir_all(dir).map_err(io(format!("creating {}", dir.display())))?;
        // No RDB snapshots and no AOF: a restart in a test is a broker restart, not a recovery
        // from disk (Celery's and RQ's jobs in flight are what the tests follow).
        let args = [
            "--port",
            &port.to_string(),
            "--bind",
            bind,
            "--protected-mode",
            if bind == "127.0.0.1" { "yes" } else { "no" },
            "--dir",
            &dir.display().to_string(),
            "--save",
            "",
            "--appendonly",
            "no",
            "--daemonize",
            "no",
            "--loglevel",
            "warning",
        ]
        .map(String::from)
        .to_vec();
        let mut redis = Self {
            process: None,
            args,
            dir: dir.to_path_buf(),
            port,
            lifetime,
            _temp: None,
        };
        redis.resume()?;
        Ok(redis)
    }

    /// Its URL, such as redis://127.0.0.1:41234/0.
    pub fn url(&self) -> String {
        format!("redis://127.0.0.1:{}/0", self.port)
    }

    /// Its URL at `host`, for Pods (see [`Self::start_reachable_at`]).
    pub fn url_at(&self, host: std::net::IpAddr) -> String {
        format!("redis://{}/0", SocketAddr::new(host, self.port))
    }

    pub fn addr(&self) -> SocketAddr {
        SocketAddr::from(([127, 0, 0, 1], self.port))
    }

    /// Its pid, while it runs.
    pub fn pid(&self) -> Option<u32> {
        self.process.as_ref().map(|p| p.child.id())
    }

    /// Stops Redis (SIGTERM); its port stays for [`Self::resume`]. Everything it held is gone.
    pub fn stop(&mut self) {
        if let Some(mut process) = self.process.take() {
            process.stop(Duration::from_secs(10));
        }
    }

    /// Starts Redis again on the same port, and waits until it answers PING.
    pub fn resume(&mut self) -> Result<()> {
        let program = which("redis-server").ok_or_else(|| TestEnvError::ToolMissing {
            tool: "redis-server".into(),
            path: PathBuf::from("/usr/bin/redis-server"),
        })?;
        let process = Process::start(
            "redis",
            &program,
            &self.args,
            self.dir.join("redis.log"),
            self.lifetime,
        )?;
        self.process = Some(process);
        let deadline = Instant::now() + READY_TIMEOUT;
        loop {
            if self.command(&["PING"]).is_ok() {
                return Ok(());
            }
            let process = self.process.as_mut().expect("resume sets the process");
            if process.exited() || Instant::now() > deadline {
                return Err(TestEnvError::NotReady {
                    what: "redis".into(),
                    seconds: READY_TIMEOUT.as_secs(),
                    log: process.log_tail(),
                });
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// Lets Redis go on running after this value is dropped (for `lanepool-testenv up`).
    pub fn detach(mut self) {
        if let Some(process) = self.process.take() {
            std::mem::forget(process);
        }
    }

    /// Sends one command and reads its reply (a new connection each time: tests ask rarely).
    pub fn command(&self, words: &[&str]) -> std::io::Result<Reply> {
        let mut stream = TcpStream::connect_timeout(&self.addr(), Duration::from_secs(1))?;
        stream.set_read_timeout(Some(Duration::from_secs(5)))?;
        let mut request = format!("*{}\r\n", words.len());
        for word in words {
            request.push_str(&format!("${}\r\n{word}\r\n", word.len()));
        }
        stream.write_all(request.as_bytes())?;
        read_reply(&mut BufReader::new(stream))
    }

    /// The integer reply of `words` (LLEN, SCARD…); panics with the reply otherwise, for tests.
    pub fn integer(&self, words: &[&str]) -> i64 {
        match self.command(words) {
            Ok(Reply::Integer(n)) => n,
            other => panic!("redis {words:?}: expected an integer, got {other:?}"),
        }
    }
}

fn read_reply(reader: &mut impl BufRead) -> std::io::Result<Reply> {
    let mut line = String::new();
    reader.read_line(&mut line)?;
    let line = line.trim_end_matches(['\r', '\n']);
    let bad = |what: &str| std::io::Error::new(std::io::ErrorKind::InvalidData, what.to_string());
    let (kind, rest) = line.split_at_checked(1).ok_or_else(|| bad("empty reply"))?;
    let number = || rest.parse::<i64>().map_err(|_| bad(line));
    Ok(match kind {
        "+" => Reply::Status(rest.into()),
        "-" => Reply::Error(rest.into()),
        ":" => Reply::Integer(number()?),
        "$" => match number()? {
            n if n < 0 => Reply::Bulk(None),
            n if n as usize > MOST_REPLY_BYTES => return Err(bad("bulk reply too large")),
            n => {
                let mut bytes = vec![0; n as usize + 2];
                std::io::Read::read_exact(reader, &mut bytes)?;
                bytes.truncate(n as usize);
                Reply::Bulk(Some(String::from_utf8_lossy(&bytes).into_owned()))
            }
        },
        "*" => {
            let n = number()?;
            let mut items = Vec::new();
            for _ in 0..n.max(0) {
                items.push(read_reply(reader)?);
            }
            Reply::Array(items)
        }
        _ => return Err(bad(line)),
    })
}
