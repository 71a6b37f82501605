//! kvfabric-connector: what the engine sees of the fabric.
//!
//! Scheduler side (how many tokens the fabric holds beyond the local cache,
//! reserve, finish) and worker side (load into engine blocks layer by layer,
//! save finished blocks write-behind). See docs/ARCHITECTURE.md, "Data flows".
