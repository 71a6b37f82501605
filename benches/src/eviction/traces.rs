//! The traces `bench eviction` replays, as block-level requests.
//!
//! Each generator is seeded and built from the agentic workload's text
//! (`agentic::trace::Workload`: a shared system prompt with tool definitions,
//! each session's own history, user turns); answers are fixed pseudo-random
//! tokens. docs/BENCHMARKS.md describes each trace. A request becomes the
//! block keys of what the engine computed (prompt and answer but its last
//! token, full blocks) and how many of them a lookup may hit (the prompt's
//! full blocks, never the prompt's last token).

use kvfabric_store::{BlockKey, KeyChain};

use crate::agentic::trace::{SplitMix64, TraceEntry, Workload, WorkloadShape};

/// One request of a trace.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Request {
    /// Keys of the blocks computed for it (and put), in prefix order.
    pub keys: Vec<BlockKey>,
    /// The first `usable` keys are looked up (a hit is their longest stored prefix).
    pub usable: usize,
    /// Prompt tokens (the denominator of the token hit ratio).
    pub prompt_tokens: usize,
    /// An agent's request (false: the scan's one-off prompts).
    pub agent: bool,
}

/// A named trace.
#[derive(Clone, Debug)]
pub struct Trace {
    pub name: String,
    pub requests: Vec<Request>,
    pub block_tokens: usize,
    /// Capacities are fractions of this many blocks (the agents' distinct
    /// blocks: for the scan trace, those of the same agents without the scan).
    pub capacity_base: usize,
}

impl Trace {
    /// Distinct blocks the trace computes.
    pub fn distinct_blocks(&self) -> usize {
        let mut seen = std::collections::HashSet::new();
        for r in &self.requests {
            seen.extend(r.keys.iter().copied());
        }
        seen.len()
    }
}

/// Shape of the generated traces (from the bench's flags).
#[derive(Clone, Debug)]
pub struct Shape {
    pub sessions: usize,
    pub turns: usize,
    pub system_tokens: usize,
    pub history_tokens: usize,
    pub answer_tokens: usize,
    pub scan_prompts: usize,
    pub seed: u64,
}

/// A request from a prompt and its answer (`agent`: whose it is).
pub fn request(chain: &KeyChain, e: &TraceEntry, agent: bool) -> Request {
    let bt = chain.block_tokens();
    let mut computed = e.prompt.clone();
    computed.extend_from_slice(&e.answer[..e.answer.len().saturating_sub(1)]);
    let keys = chain.keys(&computed[..computed.len() / bt * bt]);
    Request {
        usable: (e.prompt.len().saturating_sub(1) / bt).min(keys.len()),
        keys,
        prompt_tokens: e.prompt.len(),
        agent,
    }
}

fn workload(
    encode: &dyn Fn(&str) -> Vec<u32>,
    s: &Shape,
    sessions: usize,
    turns: usize,
) -> Workload {
    let shape = WorkloadShape {
        sessions,
        turns,
        system_tokens: s.system_tokens,
        history_tokens: s.history_tokens,
    };
    Workload::generate(encode, s.seed, &shape)
}

/// Sessions' progress: the answers each has had.
struct Sessions<'a> {
    workload: &'a Workload,
    answers: Vec<Vec<Vec<u32>>>,
    rng: SplitMix64,
    answer_tokens: usize,
}

impl<'a> Sessions<'a> {
    fn new(workload: &'a Workload, seed: u64, answer_tokens: usize) -> Self {
        Sessions {
            workload,
            answers: vec![Vec::new(); workload.users.len()],
            rng: SplitMix64::new(seed ^ 0xa5a5),
            answer_tokens,
        }
    }

    /// Session `s`'s next turn.
    fn turn(&mut self, s: usize) -> TraceEntry {
        let prompt = self.workload.prompt(s, &self.answers[s]);
        let answer: Vec<u32> = (0..self.answer_tokens)
            .map(|_| 100 + self.rng.below(40_000) as u32)
            .collect();
        self.answers[s].push(answer.clone());
        TraceEntry { prompt, answer }
    }

    fn turns_done(&self, s: usize) -> usize {
        self.answers[s].len()
    }
}

/// The agentic trace: `sessions` x `turns`, one turn each, round-robin
/// (the shared system prompt switched to `system_v2` from turn `switch_at`).
fn round_robin(w: &Workload, s: &Shape, v2: Option<(&[u32], usize)>) -> Vec<TraceEntry> {
    let mut v2w = w.clone();
    if let Some((sys, _)) = v2 {
        v2w.system = sys.to_vec();
    }
    let mut ss = Sessions::new(w, s.seed, s.answer_tokens);
    let mut out = Vec::new();
    for t in 0..s.turns {
        if v2.is_some_and(|(_, at)| t == at) {
            let answers = std::mem::take(&mut ss.answers);
            ss = Sessions::new(&v2w, s.seed ^ 0x5151, s.answer_tokens);
            ss.answers = answers;
        }
        for i in 0..s.sessions {
            out.push(ss.turn(i));
        }
    }
    out
}

/// The agentic trace alone (what `all` reports first): `sessions` x `turns`
/// round-robin, capacities based on its distinct blocks.
pub fn agentic(encode: &dyn Fn(&str) -> Vec<u32>, chain: &KeyChain, s: &Shape) -> Trace {
    let w = workload(encode, s, s.sessions, s.turns);
    agentic_of(chain, &round_robin(&w, s, None))
}

fn agentic_of(chain: &KeyChain, entries: &[TraceEntry]) -> Trace {
    let mut t = Trace {
        name: "agentic".into(),
        requests: entries.iter().map(|e| request(chain, e, true)).collect(),
        block_tokens: chain.block_tokens(),
        capacity_base: 0,
    };
    t.capacity_base = t.distinct_blocks();
    t
}

/// Every trace, in report order.
pub fn all(encode: &dyn Fn(&str) -> Vec<u32>, chain: &KeyChain, s: &Shape) -> Vec<Trace> {
    let w = workload(encode, s, s.sessions, s.turns);
    let agentic = round_robin(&w, s, None);
    let agentic_trace = agentic_of(chain, &agentic);
    let base = agentic_trace.capacity_base;
    let mk = |name: &str, entries: Vec<(TraceEntry, bool)>, capacity_base: Option<usize>| {
        let requests: Vec<Request> = entries
            .iter()
            .map(|(e, agent)| request(chain, e, *agent))
            .collect();
        let mut t = Trace {
            name: name.into(),
            requests,
            block_tokens: chain.block_tokens(),
            capacity_base: 0,
        };
        t.capacity_base = capacity_base.unwrap_or_else(|| t.distinct_blocks());
        t
    };
    let tag = |v: Vec<TraceEntry>| v.into_iter().map(|e| (e, true)).collect::<Vec<_>>();
    vec![
        agentic_trace,
        mk("zipf", tag(zipf(encode, s)), None),
        mk("ending", tag(ending(encode, s)), None),
        mk("version", tag(version(encode, s, &w)), None),
        mk("scan", scan(encode, s, agentic), Some(base)),
    ]
}

/// Sessions (twice as many) return with Zipf(1) popularity, each idle for a
/// random gap after its turn; as many requests as the agentic trace.
fn zipf(encode: &dyn Fn(&str) -> Vec<u32>, s: &Shape) -> Vec<TraceEntry> {
    let n = 2 * s.sessions;
    let w = workload(encode, s, n, 3 * s.turns);
    let mut ss = Sessions::new(&w, s.seed, s.answer_tokens);
    let mut rng = SplitMix64::new(s.seed ^ 0x21f);
    let weights: Vec<f64> = (0..n).map(|i| 1.0 / (i + 1) as f64).collect();
    let mut idle_until = vec![0usize; n];
    let mut out = Vec::new();
    let mut step = 0usize;
    while out.len() < s.sessions * s.turns && step < 1_000_000 {
        step += 1;
        let ready: Vec<usize> = (0..n)
            .filter(|&i| idle_until[i] <= step && ss.turns_done(i) < 3 * s.turns)
            .collect();
        let total: f64 = ready.iter().map(|&i| weights[i]).sum();
        if ready.is_empty() {
            continue;
        }
        let mut x = (rng.next_u64() >> 11) as f64 / (1u64 << 53) as f64 * total;
        let mut pick = ready[ready.len() - 1];
        for &i in &ready {
            if x < weights[i] {
                pick = i;
                break;
            }
            x -= weights[i];
        }
        out.push(ss.turn(pick));
        idle_until[pick] = step + rng.below(2 * s.turns);
    }
    out
}

/// Sessions that end: half as many run at once, round-robin, each for
/// 2..=2*turns turns; an ended session never returns and a new one takes its
/// place until twice `sessions` have started.
fn ending(encode: &dyn Fn(&str) -> Vec<u32>, s: &Shape) -> Vec<TraceEntry> {
    let total = 2 * s.sessions;
    let active = (s.sessions / 2).max(1);
    let w = workload(encode, s, total, 2 * s.turns);
    let mut ss = Sessions::new(&w, s.seed, s.answer_tokens);
    let mut rng = SplitMix64::new(s.seed ^ 0xe4d);
    let life = |rng: &mut SplitMix64| 2 + rng.below(2 * s.turns - 1);
    let mut slots: Vec<(usize, usize)> = (0..active.min(total))
        .map(|i| (i, life(&mut rng)))
        .collect();
    let mut started = slots.len();
    let mut out = Vec::new();
    while slots.iter().any(|&(_, left)| left > 0) {
        for slot in slots.iter_mut() {
            if slot.1 == 0 {
                continue;
            }
            out.push(ss.turn(slot.0));
            slot.1 -= 1;
            if slot.1 == 0 && started < total {
                *slot = (started, life(&mut rng));
                started += 1;
            }
        }
    }
    out
}

/// The agentic trace whose shared system prompt changes version halfway
/// (one tool definition edited near its start: every system block changes).
fn version(encode: &dyn Fn(&str) -> Vec<u32>, s: &Shape, w: &Workload) -> Vec<TraceEntry> {
    let mut v2 = w.system.clone();
    let edit = encode(" (v2)");
    let at = v2.len().min(40);
    v2.splice(at..at, edit);
    round_robin(w, s, Some((&v2, s.turns / 2)))
}

/// The agentic trace with an async batch job interleaved: `scan_prompts`
/// one-off prompts (a shared two-line instruction, then ~300 tokens of
/// their own), spread evenly between the agents' requests.
fn scan(
    encode: &dyn Fn(&str) -> Vec<u32>,
    s: &Shape,
    agents: Vec<TraceEntry>,
) -> Vec<(TraceEntry, bool)> {
    let header = encode(
        "<|im_start|>system\nYou label support tickets. Answer with one word: bug, billing, \
         account or other.<|im_end|>\n<|im_start|>user\n",
    );
    let mut rng = SplitMix64::new(s.seed ^ 0x5ca7);
    let per = s.scan_prompts as f64 / agents.len().max(1) as f64;
    let mut acc = 0.0;
    let mut out = Vec::new();
    for e in agents {
        out.push((e, true));
        acc += per;
        while acc >= 1.0 {
            acc -= 1.0;
            let mut prompt = header.clone();
            prompt.extend((0..250 + rng.below(100)).map(|_| 100 + rng.below(40_000) as u32));
            let answer = vec![100 + rng.below(40_000) as u32; 4];
            out.push((TraceEntry { prompt, answer }, false));
        }
    }
    out
}
