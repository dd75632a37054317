//! Everything a reconcile reads, once: the lanes' load from Prometheus and the workers' own
//! counts (`measure.rs`, `reads.rs`), and what the workers say they are doing (`inherited.rs`).

pub(in crate::controller) mod inherited;
pub(in crate::controller) mod measure;
pub(in crate::controller) mod reads;
