//! [`PickParams`]: the tunables of the `affinity` and `prefix` routing
//! policies, a leaf both the picker (`pick.rs`) and the prefix cost
//! (`pick_prefix.rs`) read.

/// The tunables of `affinity` and `prefix`.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct PickParams {
    /// Affinity holds while the sticky engine's load <= this x the least load + slack.
    pub affinity_load_factor: f64,
    /// Tokens added to the affinity bound (so an idle cluster stays sticky).
    pub affinity_load_slack_tokens: u64,
    /// Weight of the shared prompt tokens an engine lacks against its
    /// in-flight tokens (prefix; Dynamo's overlap weight).
    pub prefix_overlap_weight: f64,
    /// Weight of the prompt's own tokens (past the prefix it shares with
    /// other prompts: a session's history) an engine lacks (prefix).
    pub prefix_session_weight: f64,
}

impl Default for PickParams {
    fn default() -> Self {
        PickParams {
            affinity_load_factor: 1.5,
            affinity_load_slack_tokens: 4096,
            prefix_overlap_weight: 1.0,
            prefix_session_weight: DEFAULT_PREFIX_SESSION_WEIGHT,
        }
    }
}

/// The default [`PickParams::prefix_session_weight`] (see docs/BENCHMARKS.md,
/// "routing modes compared").
pub const DEFAULT_PREFIX_SESSION_WEIGHT: f64 = 4.0;
