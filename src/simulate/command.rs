//! `lanepool simulate` from flags to printed text: picks the mode (guide table, benchmark, one
//! run), runs it and writes the optional CSV and SVG files. Returns what to print.

use std::path::Path;

use super::cli::{OutputArg, SimulateArgs};
use super::error::SimulateError;
use super::{bench, engine, guide, plot, report, series, suite, tradeoff};

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
    if args.suite {
        return Ok(suite::table(
            suite::DURATION,
            &super::autoscale::lanepool_defaults(suite::WORKERS),
        ));
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
    Ok(match args.output {
        OutputArg::Json => report::json(&outcome),
        OutputArg::Text => report::text(&scenario, &outcome),
    })
}
