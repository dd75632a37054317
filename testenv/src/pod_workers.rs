//! One process answering as the worker of every Pod in the scale benchmark. kwok runs the Pods
//! and gives each an address of its own on the loopback (127.16.0.0/12); Linux delivers every
//! 127/8 address to a socket bound to 0.0.0.0, so this answers each Pod at its own address on
//! one port and counts the requests by the address asked. A Pod's finished-job counters grow
//! with its pool's lane rates split evenly over the pool's running Pods, so the operator's
//! worker reads add up to the same rates Prometheus sees; every worker is idle and drains at
//! once when asked.

use std::collections::{BTreeMap, HashMap};
use std::convert::Infallible;
use std::fmt::Write as _;
use std::net::{IpAddr, SocketAddr};
use std::sync::{Arc, Mutex};
use std::time::Instant;

use http_body_util::Full;
use hyper::body::{Bytes, Incoming};
use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper::{Method, Request, Response};
use hyper_util::rt::TokioIo;
use tokio::net::TcpListener;

use crate::error::{Result, io};

/// (namespace, pool).
type PoolOf = (String, String);

#[derive(Default)]
struct Pool {
    /// Jobs per second by lane.
    rates: BTreeMap<String, f64>,
    /// Its running Pods, by address.
    pods: Vec<IpAddr>,
}

struct Worker {
    pool: PoolOf,
    /// Finished jobs by lane, as of `counted`.
    finished: BTreeMap<String, f64>,
    counted: Instant,
    gets: u64,
    /// Asked to drain: it says so from then on, as a worker that takes no new job does.
    draining: bool,
}

#[derive(Default)]
struct State {
    pools: HashMap<PoolOf, Pool>,
    workers: HashMap<IpAddr, Worker>,
    /// Requests to addresses of no known Pod.
    strays: u64,
    drains: u64,
}

impl State {
    /// Brings a worker's counters up to now at its current share of its pool's rates.
    fn advance(&mut self, ip: IpAddr, now: Instant) {
        let Some(pool) = self.workers.get(&ip).and_then(|w| self.pools.get(&w.pool)) else {
            return;
        };
        // A draining worker takes no new job: its pool's others share the load.
        let taking = pool
            .pods
            .iter()
            .filter(|ip| self.workers.get(ip).is_some_and(|w| !w.draining))
            .count();
        let share = if worker_draining(&self.workers, ip) {
            0.0
        } else {
            1.0 / taking.max(1) as f64
        };
        let Some(worker) = self.workers.get_mut(&ip) else {
            return;
        };
        let seconds = now.duration_since(worker.counted).as_secs_f64();
        for (lane, rate) in &pool.rates {
            *worker.finished.entry(lane.clone()).or_default() += rate * share * seconds;
        }
        worker.counted = now;
    }

    fn remove(&mut self, ip: IpAddr) {
        let Some(pool) = self.workers.get(&ip).map(|w| w.pool.clone()) else {
            return;
        };
        self.advance_pool(&pool, Instant::now());
        self.workers.remove(&ip);
        if let Some(pool) = self.pools.get_mut(&pool) {
            pool.pods.retain(|p| *p != ip);
        }
    }

    /// Advances every worker of a pool before its rates or its Pods change, so each counter
    /// only ever grows at the share it had.
    fn advance_pool(&mut self, pool: &PoolOf, now: Instant) {
        let pods = self
            .pools
            .get(pool)
            .map(|p| p.pods.clone())
            .unwrap_or_default();
        for ip in pods {
            self.advance(ip, now);
        }
    }
}

fn worker_draining(workers: &HashMap<IpAddr, Worker>, ip: IpAddr) -> bool {
    workers.get(&ip).is_some_and(|w| w.draining)
}

/// Request counts at the Pods.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct PodRequests {
    /// GETs at the Pods known now, and the most any one of them got.
    pub gets: u64,
    pub most_gets_at_one_pod: u64,
    pub pods: usize,
    pub drains: u64,
    pub strays: u64,
}

/// The workers of every benchmark Pod, on one port.
pub struct PodWorkers {
    port: u16,
    state: Arc<Mutex<State>>,
    server: tokio::task::JoinHandle<()>,
}

impl PodWorkers {
    /// Listens on 0.0.0.0:`port` (every loopback address).
    pub async fn start(port: u16) -> Result<Self> {
        let listener = TcpListener::bind(SocketAddr::from(([0, 0, 0, 0], port)))
            .await
            .map_err(io(format!(
                "listening on 0.0.0.0:{port} for the Pods' workers"
            )))?;
        let state = Arc::new(Mutex::new(State::default()));
        let server = tokio::spawn(serve(listener, state.clone()));
        Ok(Self {
            port,
            state,
            server,
        })
    }

    pub fn port(&self) -> u16 {
        self.port
    }

    fn state(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Sets a lane's rate for a pool's workers together.
    pub fn set_lane(&self, namespace: &str, pool: &str, lane: &str, rate: f64) {
        let key = (namespace.to_owned(), pool.to_owned());
        let mut state = self.state();
        state.advance_pool(&key, Instant::now());
        state
            .pools
            .entry(key)
            .or_default()
            .rates
            .insert(lane.to_owned(), rate);
    }

    /// A Pod of `pool` runs at `ip`.
    pub fn add_pod(&self, ip: IpAddr, namespace: &str, pool: &str) {
        let key = (namespace.to_owned(), pool.to_owned());
        let mut state = self.state();
        if state.workers.get(&ip).is_some_and(|w| w.pool == key) {
            return;
        }
        state.remove(ip);
        let now = Instant::now();
        state.advance_pool(&key, now);
        state.pools.entry(key.clone()).or_default().pods.push(ip);
        state.workers.insert(
            ip,
            Worker {
                pool: key,
                finished: BTreeMap::new(),
                counted: now,
                gets: 0,
                draining: false,
            },
        );
    }

    /// The Pod at `ip` is gone.
    pub fn remove_pod(&self, ip: IpAddr) {
        self.state().remove(ip);
    }

    /// The requests counted so far.
    pub fn requests(&self) -> PodRequests {
        let state = self.state();
        PodRequests {
            gets: state.workers.values().map(|w| w.gets).sum(),
            most_gets_at_one_pod: state.workers.values().map(|w| w.gets).max().unwrap_or(0),
            pods: state.workers.len(),
            drains: state.drains,
            strays: state.strays,
        }
    }

    /// Each known Pod's GETs, by address.
    pub fn gets_by_pod(&self) -> HashMap<IpAddr, u64> {
        let state = self.state();
        state.workers.iter().map(|(ip, w)| (*ip, w.gets)).collect()
    }
}

impl Drop for PodWorkers {
    fn drop(&mut self) {
        self.server.abort();
    }
}

async fn serve(listener: TcpListener, state: Arc<Mutex<State>>) {
    loop {
        let Ok((stream, _)) = listener.accept().await else {
            continue;
        };
        // The address the operator asked: the Pod's.
        let Ok(local) = stream.local_addr() else {
            continue;
        };
        let state = state.clone();
        tokio::spawn(async move {
            let service = service_fn(move |request: Request<Incoming>| {
                let uri = request.uri();
                let body = answer(
                    &state,
                    local.ip(),
                    request.method(),
                    uri.path(),
                    uri.query(),
                );
                async move { Ok::<_, Infallible>(body) }
            });
            let _ = http1::Builder::new()
                .serve_connection(TokioIo::new(stream), service)
                .await;
        });
    }
}

fn answer(
    state: &Mutex<State>,
    ip: IpAddr,
    method: &Method,
    path: &str,
    query: Option<&str>,
) -> Response<Full<Bytes>> {
    let mut state = state.lock().unwrap_or_else(|p| p.into_inner());
    let text = match (method, path) {
        (&Method::GET, "/metrics") => {
            state.advance(ip, Instant::now());
            match state.workers.get_mut(&ip) {
                Some(worker) => {
                    worker.gets += 1;
                    let mut text = format!(
                        "lanepool_worker_busy 0\nlanepool_worker_draining {}\n",
                        u8::from(worker.draining)
                    );
                    for (lane, count) in &worker.finished {
                        let _ = writeln!(
                            text,
                            "lanepool_job_duration_seconds_count{{lane=\"{lane}\"}} {}",
                            count.floor()
                        );
                    }
                    Some(text)
                }
                None => None,
            }
        }
        (&Method::POST, "/drain") if state.workers.contains_key(&ip) => {
            state.drains += 1;
            if let Some(pool) = state.workers.get(&ip).map(|w| w.pool.clone()) {
                state.advance_pool(&pool, Instant::now());
            }
            // `seconds=0` calls a drain off.
            let draining = query.is_none_or(|q| !q.split('&').any(|p| p == "seconds=0"));
            if let Some(worker) = state.workers.get_mut(&ip) {
                worker.draining = draining;
            }
            Some(format!(
                "lanepool_worker_busy 0\nlanepool_worker_draining {}\n",
                u8::from(draining)
            ))
        }
        _ => None,
    };
    match text {
        Some(text) => Response::new(Full::new(Bytes::from(text))),
        None => {
            state.strays += 1;
            let mut response = Response::new(Full::new(Bytes::new()));
            *response.status_mut() = hyper::StatusCode::NOT_FOUND;
            response
        }
    }
}
