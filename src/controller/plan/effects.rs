//! What the plan returns for act to perform ([`Effects`]), and the answers act hands back.

use std::time::Duration;

use kube::runtime::events::EventType;

use crate::controller::rollout::drain::DrainAnswer;
use crate::controller::rollout::{Held, Release};
use crate::sizing::Replicas;

/// A request to one worker, and where its answer goes.
#[derive(Clone, Debug, PartialEq)]
pub(crate) struct Ask {
    pub(crate) pod: String,
    pub(crate) request: Request,
    pub(crate) records: Records,
}

/// What a worker is asked.
#[derive(Clone, Debug, PartialEq)]
pub(crate) enum Request {
    /// `POST /drain?seconds=N` (`0`: stop draining).
    Drain(u64),
    /// `POST /stand-in?lanes=…&seconds=N`.
    StandIn { lanes: Vec<String>, seconds: u64 },
    /// `POST /stand-in?seconds=0`: serve its own lanes again.
    OwnLanes,
}

impl Request {
    /// The path of the request.
    pub(crate) fn path(&self) -> String {
        match self {
            Request::Drain(seconds) => format!("/drain?seconds={seconds}"),
            Request::StandIn { lanes, seconds } => {
                format!("/stand-in?lanes={}&seconds={seconds}", lanes.join(","))
            }
            Request::OwnLanes => "/stand-in?seconds=0".into(),
        }
    }
}

/// Which of the pool's steps an answer is for.
#[derive(Clone, Debug, PartialEq)]
pub(crate) enum Records {
    /// None: a worker called back.
    Nothing,
    /// The drain of a shrinking Deployment.
    Drain(String),
    /// The drain of a Deployment's rollover.
    Rollover(String),
    /// The drained workers of a Deployment's shrink written already.
    Shrunk(String),
    /// The stand-ins of a Deployment's waiting shrink.
    StandIn(String),
}

/// What a worker answered.
#[derive(Clone, Copy, Debug, PartialEq)]
pub(crate) enum Answer {
    Drain(DrainAnswer),
    StandIn(StandInAnswer),
}

/// What a worker answered to a stand-in request.
#[derive(Clone, Copy, Debug, PartialEq)]
pub(crate) enum StandInAnswer {
    StandingIn,
    Refused,
    /// Not heard from: it may have taken the request late.
    Unreachable,
}

impl StandInAnswer {
    /// Its `outcome` label in `lanepool_operator_stand_in_answers`.
    pub(crate) fn outcome(self) -> &'static str {
        match self {
            StandInAnswer::StandingIn => "standing_in",
            StandInAnswer::Refused => "refused",
            StandInAnswer::Unreachable => "unreachable",
        }
    }
}

/// An event for the pool: its type, reason and note.
pub(crate) type Note = (EventType, &'static str, String);

/// What one reconcile's rollout does, for act to perform in this order: the growth alone; the
/// requests to workers, the deletion costs and the readiness gates; the release; the events.
#[derive(Clone, Debug, PartialEq)]
pub(crate) struct Effects {
    /// Written first and alone, before any worker is asked anything.
    pub(crate) growth: Option<Replicas>,
    pub(crate) asks: Vec<Ask>,
    /// Deletion costs to set, by Pod name.
    pub(crate) costs: Vec<(String, i32)>,
    /// Readiness gates to open: Pod name and reason.
    pub(crate) gates: Vec<(String, &'static str)>,
    /// What goes out now, and what still waits.
    pub(crate) release: Release,
    pub(crate) held: Vec<Held>,
    pub(crate) events: Vec<Note>,
    /// Of the workers the shrinks written now stop, how many are busy (`None`: none ranked).
    pub(crate) stopped_busy: Option<u64>,
    /// How long a surge that ended now waited.
    pub(crate) surge_ended: Option<Duration>,
}
