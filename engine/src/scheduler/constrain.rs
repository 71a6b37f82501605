//! Grammar masks computed while the forward pass runs.
//!
//! A constrained sequence's next mask depends only on the tokens it has
//! taken, not on the logits the step is computing, so it need not wait for
//! them: before the forward pass a helper thread takes the grammar matchers
//! of the planned sequences, computes their masks while the model runs, and
//! hands them back before the rows are sampled. The step then pays only
//! what the mask work takes beyond the forward pass (and starting the
//! helper), instead of all of it after the pass, on the scheduler thread,
//! for every sequence in the batch. Only the first row of a step is
//! prepared this way: the rows of a verified draft follow tokens that are
//! not sampled yet, so their masks are computed when they are sampled.
//!
//! The helper needs a core the kernels leave free: with one kernel thread
//! per core it only competes with them (measured on 2 cores: 0.95 to 1.10
//! of the serial step, docs/BENCHMARKS.md `perf_grammar`), so then the
//! masks are computed serially, when the rows are sampled.

use super::Scheduler;
use crate::grammar::GrammarMatcher;
use crate::model::RowLogits;
use crate::EngineError;

impl Scheduler {
    /// [`forward`](Scheduler::forward), with the grammar masks of the
    /// planned sequences prepared meanwhile on a helper thread.
    pub(super) fn forward_masked(
        &mut self,
        plan: &[(usize, usize)],
    ) -> (Result<RowLogits, EngineError>, Vec<usize>) {
        if !self.spare_core() {
            return self.forward(plan);
        }
        let mut taken: Vec<(usize, GrammarMatcher)> = plan
            .iter()
            .filter_map(|&(i, _)| self.running[i].sampler.take_grammar().map(|g| (i, g)))
            .collect();
        if taken.is_empty() {
            return self.forward(plan);
        }
        let (out, back) = std::thread::scope(|sc| {
            let helper = sc.spawn(move || {
                for (_, g) in taken.iter_mut() {
                    g.prepare();
                }
                taken
            });
            let out = self.forward(plan);
            (out, helper.join())
        });
        // A helper that panicked lost its matchers: their samplers then
        // fail the request (`Sampler::constrain`) rather than go on free.
        for (i, g) in back.unwrap_or_default() {
            self.running[i].sampler.put_grammar(g);
        }
        out
    }

    /// Whether the kernel threads leave a core for the mask helper.
    fn spare_core(&self) -> bool {
        let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
        self.cx.pool.threads() < cores
    }
}
