//! `lanepool simulate` from flags to printed text: picks the mode (guide table, benchmark, one
//! run), runs it and writes the optional CSV and SVG files. Returns what to print. The flags
//! and their checks are in [`args`]; how a run is shown in `render`, `series` and `plot`.

use std::path::Path;

pub mod args;
pub mod plot;
mod render;
mod series;

use crate::simulate::SimulateError;
use crate::simulate::engine;
use crate::simulate::studies::{bench, guide, held_out, steady, suite, tradeoff, versus};
use args::{OutputArg, SimulateArgs};

fn write(path: &Path, contents: &str) -> Result<(), SimulateError> {
    std::fs::write(path, contents).map_err(|source| SimulateError::Write {
        path: path.to_path_buf(),
        source,
    })
}

pub fn run(args: &SimulateArgs) -> Result<String, SimulateError> {
    if args.guide_table {
        return Ok(guide::table());
    }
    if args.bench {
        return Ok(bench::run());
    }
    if args.suite && args.steady {
        if engine::scenario::nanos(args.pod_start) != engine::autoscale::POD_START {
            let world =
                crate::duration::trim(engine::scenario::seconds(engine::autoscale::POD_START));
            return Err(SimulateError::flag(
                "--pod-start",
                format!(
                    "--suite --steady runs each pool in the simulator's world (a {world}s pod \
                     start); --pod-start applies to --suite and single runs"
                ),
            ));
        }
        return Ok(steady::table());
    }
    if args.suite {
        let set = if args.held_out {
            held_out::set()
        } else {
            suite::Set::suite()
        };
        let shapes = if args.suite_shapes.is_empty() {
            set.shapes
        } else {
            let mut chosen = Vec::new();
            for name in &args.suite_shapes {
                let shape = set.shapes.iter().find(|s| s.name == name.as_str());
                match shape {
                    Some(shape) => chosen.push(shape.clone()),
                    None => {
                        let known: Vec<&str> = set.shapes.iter().map(|s| s.name).collect();
                        return Err(SimulateError::flag(
                            "--suite-shapes",
                            format!("no shape {name:?}; the set has {}", known.join(", ")),
                        ));
                    }
                }
            }
            chosen
        };
        let set = suite::Set {
            shapes,
            workers: args.workers,
            seeds: if args.suite_seeds.is_empty() {
                set.seeds
            } else {
                args.suite_seeds.clone()
            },
        };
        // The pool is a default LanePool; the world's pod start is the user's to state.
        let config = engine::scenario::Autoscale {
            pod_start: engine::scenario::nanos(args.pod_start),
            stand_ins: args.stand_ins,
            ..engine::autoscale::lanepool_defaults(args.workers)
        };
        if args.versus.is_some() {
            return Ok(versus::table(&set, suite::DURATION, &config));
        }
        return Ok(suite::table(&set, suite::DURATION, &config));
    }
    if args.trade_off {
        let scenario = SimulateArgs {
            autoscale: true,
            ..args.clone()
        }
        .scenario()?;
        return Ok(match &scenario.autoscale {
            Some(config) => tradeoff::table(&scenario, config),
            None => String::new(),
        });
    }
    let scenario = args.scenario()?;
    let outcome = engine::run(&scenario);
    if let Some(path) = &args.series {
        write(path, &series::csv(&outcome))?;
    }
    if let Some(path) = &args.plot {
        write(path, &plot::svg(&outcome))?;
    }
    let from = engine::scenario::nanos(args.warm_up);
    Ok(match args.output {
        OutputArg::Json => render::json(&outcome, from),
        OutputArg::Text => render::text(&scenario, &outcome, from),
    })
}
