//! What else to change besides applying the LanePool, numbered in the order to do it: what to
//! check and build before, then apply the pool, wait for its workers, and only then retire the
//! Deployment, so that no lane is ever left without workers. Pure: text from what was made.

use super::command::{self, Framework};
use super::pool::{Migrated, Worker};
use super::source::Source;

/// The summary line and the numbered steps, for stderr.
pub fn steps(migrated: &Migrated, source: &Source) -> String {
    let mut steps: Vec<String> = Vec::new();
    before(migrated, &mut steps);
    apply(migrated, &mut steps);
    retire(migrated, source, &mut steps);
    let mut text = summary(migrated);
    text.push_str("\n\nWhat else to change, in this order:\n");
    for (number, step) in steps.iter().enumerate() {
        let mut lines = step.lines();
        text.push_str(&format!(
            "{:>2}. {}\n",
            number + 1,
            lines.next().unwrap_or_default()
        ));
        for line in lines {
            text.push_str(&format!("    {line}\n"));
        }
    }
    text
}

/// The pool's name and the line to reach it with kubectl.
fn kubectl(migrated: &Migrated) -> String {
    match migrated.namespace() {
        Some(namespace) => format!("kubectl -n {namespace}"),
        None => "kubectl".into(),
    }
}

fn summary(migrated: &Migrated) -> String {
    let lanes: Vec<String> = migrated
        .pool
        .spec
        .lanes
        .iter()
        .map(|lane| {
            let mut about: Vec<String> = lane
                .queue
                .iter()
                .map(|queue| format!("queue {queue}"))
                .collect();
            if let Some(reserve) = &lane.reserve {
                about.push(format!("a reserve of {} to {}", reserve.min, reserve.max));
            }
            match about.is_empty() {
                true => lane.name.clone(),
                false => format!("{} ({})", lane.name, about.join(", ")),
            }
        })
        .collect();
    let total = migrated.pool.spec.total_workers.unwrap_or_default();
    let command = match &migrated.worker {
        Worker::Rewritten(rewritten) => format!(
            "{} {} → {}",
            rewritten.framework.name(),
            command::shown(&migrated.old_command),
            command::shown(&rewritten.argv)
        ),
        Worker::Kept(_) => format!("{} kept as it is", command::shown(&migrated.old_command)),
    };
    format!(
        "lanepool migrate: LanePool {} from Deployment {}, container {}: lanes {}; totalWorkers \
         {total}{}; {command}.",
        migrated.name(),
        migrated.deployment,
        migrated.container,
        lanes.join(", "),
        if migrated.total_from_replicas {
            " (its replicas)"
        } else {
            ""
        },
    )
}

/// What to check, build and set before the pool is applied.
fn before(migrated: &Migrated, steps: &mut Vec<String>) {
    let port = migrated.edited.metrics_port;
    match &migrated.worker {
        Worker::Rewritten(rewritten) => {
            if !rewritten.dropped.is_empty() {
                let mut step = match rewritten.framework {
                    Framework::Rq => "Check what these options of the old command did: \
                                      lanepool-rq-worker does not take them, so they were left \
                                      out:"
                        .to_string(),
                    Framework::Celery => "Check these options of the old command, left out: \
                                          configure(app) decides what they did:"
                        .to_string(),
                };
                for dropped in &rewritten.dropped {
                    step.push_str(&format!("\n  {}: {}", dropped.option, dropped.why));
                }
                steps.push(step);
            }
            steps.extend(rewritten.notes.iter().cloned());
        }
        Worker::Kept(why) => steps.push(format!(
            "The container's command is kept as it is ({why}). The pool's workers run it, so it \
             must take the lanes of LANEPOOL_LANES in that order and, for the operator to drain \
             a worker before a scale-down, serve the worker protocol at the port named metrics \
             ({port}): docs/workers.md#other-queues-what-a-worker-must-do. A worker that goes on \
             taking every queue makes the reserve no reserve."
        )),
    }
    if let Some(queues) = &migrated.queues_left_out {
        let (queue, is, it) = match queues.len() {
            1 => ("queue", "is", "it"),
            _ => ("queues", "are", "them"),
        };
        steps.push(format!(
            "The command's {queue} {} {is} no lane of --lanes {}: every worker of the pool takes \
             exactly its lanes, so once the Deployment is retired no one takes {it}.",
            queues.join(", "),
            migrated.queues().collect::<Vec<_>>().join(","),
        ));
    }
    let image = migrated.image.as_deref().unwrap_or("(none)");
    let runs = if migrated.image_given {
        format!("The pool runs the image {image} (--image).")
    } else {
        format!(
            "The pool runs the Deployment's image, {image}, until you give a new one (--image, \
             or in its spec.template)."
        )
    };
    match migrated.framework() {
        Some(Framework::Rq) => steps.push(format!(
            "The image: lanepool-rq-worker must be on PATH, from lanepool's worker package: pip \
             install './python[rq]' from the lanepool repository (not on PyPI yet), or build on \
             the python-worker image (docs/workers.md#the-image). {runs}"
        )),
        Some(Framework::Celery) => {
            let app = match &migrated.worker {
                Worker::Rewritten(rewritten) => rewritten.app.as_deref().unwrap_or("your app"),
                Worker::Kept(_) => "your app",
            };
            steps.push(format!(
                "The app: in the module that -A {app} names, add\n  \
                 from lanepool_worker.celery import configure\n  \
                 configure(app)   # after app = Celery(...)\n\
                 (docs/workers.md#celery), and pip install './python[celery]' from the lanepool \
                 repository in the image. The old Deployment may run that image too: without \
                 LANEPOOL_LANES, configure(app) leaves lanepool off and the worker takes its -Q \
                 and -c as before, with Celery's priority order, prefetch 1 and late acks. {runs}"
            ));
            slots(migrated, steps);
        }
        None => {}
    }
    if let Some(redis) = &migrated.edited.redis {
        steps.push(format!("{}.", capitalised(redis)));
    }
    if migrated.edited.metrics_port_existed {
        steps.push(format!(
            "The container had a port named metrics ({port}): the worker package now serves it \
             (LANEPOOL_METRICS_ADDR), so whatever served it before must move to another port."
        ));
    }
    steps.push(arrival_rate(migrated));
    steps.push(format!(
        "Prometheus: scrape the pool's workers at their port named metrics ({port}) with the \
         labels namespace, pool and pod, as examples/prometheus/podmonitor.yaml (the Prometheus \
         Operator) or scrape-config.yaml does for every pool (docs/operations.md#scrape-the-workers). \
         The pool's Pods keep the Deployment's labels, so a scrape job that selects those finds \
         them too, without the pool label the operator's queries read."
    ));
}

/// A Celery worker's slots: what it ran at once before, against what each pool worker runs.
fn slots(migrated: &Migrated, steps: &mut Vec<String>) {
    let Worker::Rewritten(rewritten) = &migrated.worker else {
        return;
    };
    let slots = migrated.pool.spec.slots_per_worker;
    if rewritten.concurrency.is_none() && slots == 1 {
        steps.push(
            "The old worker sets no --concurrency: it ran as many jobs at once as its node has \
             CPUs (or the app's worker_concurrency). Each worker of the pool runs \
             spec.slotsPerWorker jobs at once (LANEPOOL_SLOTS, which configure(app) makes its \
             concurrency), 1 here: set it to what one worker should run (--slots-per-worker)."
                .into(),
        );
    }
}

/// The producer needs no change; counting in it is what makes a burst seen sooner.
fn arrival_rate(migrated: &Migrated) -> String {
    let set = format!(
        "LANEPOOL_NAMESPACE={} and LANEPOOL_POOL={} set in the producer",
        migrated.namespace().unwrap_or("<namespace>"),
        migrated.name()
    );
    let count = match migrated.framework() {
        Some(Framework::Rq) => format!(
            "lanepool_worker.producer.submit_rq(queue, func, ...) in place of \
             queue.enqueue(func, ...), with {set}"
        ),
        Some(Framework::Celery) => {
            format!("lanepool_worker.producer.install_celery_hook(), with {set}")
        }
        None => {
            return "The arrival rate and job time come from the workers: they must export the \
                    metric convention (docs/worker-protocol.md#the-metric-convention), with \
                    lanepool_queue_depth for the queue's growth to count."
                .into();
        }
    };
    format!(
        "The producer needs no change: the urgent lane's arrival rate is the workers' finished \
         jobs plus the growth of its queue (docs/workers.md#the-arrival-rate-the-producers-counter-or-the-workers-alone). \
         Optionally, for the pool to see a burst before the queue shows it, count in the \
         producer: {count}."
    )
}

/// Apply the pool and wait for its workers, with the old ones still running.
fn apply(migrated: &Migrated, steps: &mut Vec<String>) {
    let kubectl = kubectl(migrated);
    let name = migrated.name();
    let reserved: Vec<String> = migrated
        .pool
        .spec
        .reserve_lanes()
        .map(|(lane, _)| format!("deployment/{name}-{}-reserved", lane.name))
        .collect();
    steps.push(format!(
        "Apply the pool, with the operator and its CRD installed (README.md#install-with-helm): \
         {kubectl} apply -f pool.yaml. Then wait until its workers are ready:\n  \
         {kubectl} wait --for=condition=Available {} deployment/{name}-shared --timeout=10m\n\
         Until the next steps, the Deployment's workers and the pool's take from the same \
         queues, so no lane is ever without workers; the namespace runs both (leave room in its \
         quota).",
        reserved.join(" ")
    ));
}

/// Remove what scales the Deployment, then the Deployment, then the others on the same lanes.
fn retire(migrated: &Migrated, source: &Source, steps: &mut Vec<String>) {
    let kubectl = kubectl(migrated);
    let total = migrated.pool.spec.total_workers.unwrap_or_default();
    let deployment = source
        .deployment
        .metadata
        .name
        .as_deref()
        .unwrap_or_default();
    let found = matches!(&source.autoscalers, Ok(found) if !found.is_empty());
    let resize = format!(
        "To size the pool's total the same way, point it at the LanePool's /scale \
         (docs/operations.md#size-the-whole-pool-with-an-hpa-or-keda){}",
        match (migrated.total_from_replicas, found) {
            (true, true) => format!(
                "; totalWorkers {total} is the replicas it had set: set what the pool should run \
                 (--total-workers)."
            ),
            (true, false) => format!(
                "; if one did, totalWorkers {total} is the replicas it had set: set what the pool \
                 should run (--total-workers)."
            ),
            (false, _) => ".".into(),
        }
    );
    match &source.autoscalers {
        Ok(found) if !found.is_empty() => {
            let deletes: Vec<String> = found
                .iter()
                .map(|autoscaler| {
                    let kind = match autoscaler.kind {
                        "ScaledObject" => "scaledobject",
                        _ => "hpa",
                    };
                    format!("  {kubectl} delete {kind} {}", autoscaler.name)
                })
                .collect();
            steps.push(format!(
                "Delete what scales the Deployment first, or it scales it back up:\n{}\n{resize}",
                deletes.join("\n")
            ));
        }
        Ok(_) if source.file.is_some() => steps.push(format!(
            "If an HPA or a KEDA ScaledObject outside the manifest scales Deployment \
             {deployment}, delete it first, or it scales it back up. {resize}"
        )),
        Ok(_) => {}
        Err(why) => steps.push(format!(
            "{}: if an HPA or a KEDA ScaledObject scales Deployment {deployment}, delete it \
             first, or it scales it back up. {resize}",
            capitalised(why)
        )),
    }
    let stop = match migrated.framework() {
        Some(framework) => format!(
            "{}'s workers finish the job in hand on SIGTERM",
            framework.name()
        ),
        None => "A worker must finish the job in hand on SIGTERM".into(),
    };
    steps.push(format!(
        "Only then retire the Deployment: scale it to 0, and delete it once its Pods are gone:\n  \
         {kubectl} scale deployment/{deployment} --replicas 0\n  \
         {kubectl} delete deployment/{deployment}\n\
         {stop}, within terminationGracePeriodSeconds ({} s here, and in the pool): it must be \
         longer than the longest job, or that job is cut short.",
        migrated.edited.grace_seconds
    ));
    for (other, lanes) in &migrated.others_on_the_lanes {
        steps.push(format!(
            "Deployment {other} of the manifest also takes from the pool's lanes ({}): retire it \
             and its autoscaler the same way once the pool runs.",
            lanes.join(", ")
        ));
    }
}

fn capitalised(text: &str) -> String {
    let mut chars = text.chars();
    match chars.next() {
        Some(first) => first.to_uppercase().chain(chars).collect(),
        None => String::new(),
    }
}
