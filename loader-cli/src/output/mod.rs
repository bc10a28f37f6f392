//! What uprobe-run makes of what the runtime sends while the program runs: the
//! aggregations served as Prometheus metrics ([`serve`]). The modes call into it; it knows
//! nothing of the arguments, only the plan's values it is handed.
//!
//! Context: uprobe-run's own process, beside the running program.

pub mod serve;
