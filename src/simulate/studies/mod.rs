//! Studies built on the engine: the guide's table, the trade-off between urgent p99 and batch
//! throughput against static splits and a hindsight oracle, the bursty-traffic suite and its
//! held-out shapes, the steady-load grid, and the benchmark.

pub mod bench;
pub mod guide;
pub mod held_out;
pub mod steady;
pub mod suite;
pub mod tradeoff;
pub mod versus;

/// `work` on every item, on every core, in the items' order.
pub fn in_parallel<T: Sync, R: Send>(items: &[T], work: impl Fn(&T) -> R + Sync) -> Vec<R> {
    let threads = std::thread::available_parallelism().map_or(1, |n| n.get());
    let next = std::sync::atomic::AtomicUsize::new(0);
    let mut results: Vec<Option<R>> = std::iter::repeat_with(|| None).take(items.len()).collect();
    std::thread::scope(|scope| {
        let handles: Vec<_> = (0..threads)
            .map(|_| {
                scope.spawn(|| {
                    let mut done = Vec::new();
                    loop {
                        let i = next.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                        let Some(item) = items.get(i) else {
                            return done;
                        };
                        done.push((i, work(item)));
                    }
                })
            })
            .collect();
        for handle in handles {
            for (i, result) in handle.join().unwrap_or_default() {
                results[i] = Some(result);
            }
        }
    });
    results.into_iter().flatten().collect()
}
