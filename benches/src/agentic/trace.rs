//! The agentic workload of `kvfabric bench agentic` and its oracle.
//!
//! An agent conversation resends its whole history every turn: a shared
//! system prompt with tool definitions (~1000 tokens, the same for every
//! session), then per session user / tool messages and the model's answers.
//! [`Workload::generate`] builds that text deterministically from a seed
//! (ChatML markers, as SmolLM2 was trained on) and tokenizes each segment
//! separately, so turn t's prompt is exactly turn t-1's prompt + its answer
//! tokens + the new user segment: every prompt extends an earlier one, which
//! is what a prefix cache can reuse.
//!
//! [`oracle_cached_tokens`] is the most any cache of full blocks could reuse
//! for each request of a trace: the longest prefix it shares with an earlier
//! request's tokens whose KV exists (prompt + answer but its last token), in
//! whole blocks, leaving one prompt token to compute (the engine's rule).

/// A small deterministic generator (SplitMix64): same seed, same workload,
/// on every machine and build.
#[derive(Clone, Debug)]
pub struct SplitMix64(u64);

impl SplitMix64 {
    pub fn new(seed: u64) -> Self {
        SplitMix64(seed)
    }

    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// Uniform in `0..n` (`n > 0`).
    pub fn below(&mut self, n: usize) -> usize {
        ((self.next_u64() as u128 * n as u128) >> 64) as usize
    }

    fn pick<'a>(&mut self, items: &[&'a str]) -> &'a str {
        items[self.below(items.len())]
    }
}

/// The engine a request goes to: uniform over `engines`, fixed by
/// (seed, session, turn) so every configuration routes the trace alike.
pub fn route(seed: u64, session: usize, turn: usize, engines: usize) -> usize {
    let mut r = SplitMix64::new(seed ^ ((session as u64) << 32 | turn as u64).wrapping_mul(31));
    r.next_u64();
    r.below(engines.max(1))
}

const VERBS: &[&str] = &[
    "read",
    "write",
    "list",
    "search",
    "update",
    "delete",
    "create",
    "fetch",
    "run",
    "check",
    "compare",
    "summarize",
    "deploy",
    "restart",
    "query",
    "parse",
    "validate",
    "archive",
];
const NOUNS: &[&str] = &[
    "file",
    "directory",
    "ticket",
    "issue",
    "branch",
    "commit",
    "table",
    "record",
    "invoice",
    "user",
    "order",
    "report",
    "metric",
    "alert",
    "service",
    "container",
    "bucket",
    "calendar",
    "email",
    "document",
    "schema",
    "dataset",
    "build",
    "release",
    "node",
    "cluster",
    "queue",
];
const WORDS: &[&str] = &[
    "the",
    "a",
    "latest",
    "failing",
    "customer",
    "weekly",
    "staging",
    "production",
    "pending",
    "large",
    "old",
    "new",
    "broken",
    "shared",
    "private",
    "remote",
    "local",
    "cached",
    "slow",
    "please",
    "also",
    "then",
    "first",
    "after",
    "before",
    "again",
    "quickly",
    "carefully",
    "all",
    "every",
    "missing",
    "duplicate",
    "urgent",
    "open",
    "closed",
    "with",
    "without",
    "from",
    "into",
];
const TYPES: &[&str] = &["string", "integer", "boolean", "number", "array"];

fn sentence(rng: &mut SplitMix64, words: usize) -> String {
    let mut s = String::new();
    for i in 0..words {
        if i > 0 {
            s.push(' ');
        }
        let w = match rng.below(5) {
            0 => rng.pick(VERBS),
            1 | 2 => rng.pick(NOUNS),
            _ => rng.pick(WORDS),
        };
        s.push_str(w);
    }
    s.push('.');
    s
}

fn tool_definition(rng: &mut SplitMix64, index: usize) -> String {
    let name = format!("{}_{}_{index}", rng.pick(VERBS), rng.pick(NOUNS));
    let nparams = 2 + rng.below(3);
    let mut props = Vec::new();
    let mut required = Vec::new();
    for p in 0..nparams {
        let pname = format!("{}_{p}", rng.pick(NOUNS));
        let words = 6 + rng.below(6);
        props.push(format!(
            "\"{pname}\": {{\"type\": \"{}\", \"description\": \"{}\"}}",
            rng.pick(TYPES),
            sentence(rng, words)
        ));
        if rng.below(2) == 0 {
            required.push(format!("\"{pname}\""));
        }
    }
    let words = 10 + rng.below(10);
    format!(
        "{{\"name\": \"{name}\", \"description\": \"{}\", \"parameters\": {{\"type\": \"object\", \"properties\": {{{}}}, \"required\": [{}]}}}}\n",
        sentence(rng, words),
        props.join(", "),
        required.join(", ")
    )
}

/// Text of a user turn: a request, sometimes with a tool result pasted in.
fn user_message(rng: &mut SplitMix64, session: usize, turn: usize) -> String {
    let words = 12 + rng.below(20);
    let mut m = format!("[session {session} turn {turn}] {}", sentence(rng, words));
    if rng.below(2) == 0 {
        let tool = format!("{}_{}", rng.pick(VERBS), rng.pick(NOUNS));
        let words = 15 + rng.below(25);
        m.push_str(&format!(
            "\nTool result of {tool}: {{\"status\": \"ok\", \"items\": {}, \"note\": \"{}\"}}",
            rng.below(1000),
            sentence(rng, words)
        ));
    }
    m
}

/// Session `session`'s own context: earlier user / assistant / tool turns
/// grown until they reach `tokens` tokens (none for 0). Drawn from its own
/// generator, so the rest of the trace is the same with or without it.
fn session_history(
    encode: &dyn Fn(&str) -> Vec<u32>,
    seed: u64,
    session: usize,
    tokens: usize,
) -> Vec<u32> {
    let mut out = Vec::new();
    let mut rng = SplitMix64::new(seed ^ 0x5e55_1095_0000_0000 ^ session as u64);
    let mut turn = 0;
    while out.len() < tokens {
        let words = 10 + rng.below(20);
        let user = sentence(&mut rng, words);
        let tool = format!("{}_{}", rng.pick(VERBS), rng.pick(NOUNS));
        let mut result = String::new();
        for _ in 0..3 + rng.below(4) {
            let words = 8 + rng.below(16);
            result.push_str(&sentence(&mut rng, words));
            result.push(' ');
        }
        let words = 8 + rng.below(12);
        let answer = sentence(&mut rng, words);
        out.extend(encode(&format!(
            "<|im_start|>user\n[session {session} earlier turn {turn}] {user}\nTool result of {tool}: {result}<|im_end|>\n<|im_start|>assistant\n{answer}<|im_end|>\n"
        )));
        turn += 1;
    }
    out
}

/// The size of a generated trace.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct WorkloadShape {
    pub sessions: usize,
    pub turns: usize,
    /// The shared system prompt grows tool by tool to at least this many tokens.
    pub system_tokens: usize,
    /// Each session starts with its own context of at least this many tokens
    /// (earlier conversation and tool output, as multi-round-qa's
    /// `--user-history-prompt`); 0 = none.
    pub history_tokens: usize,
}

/// Token ids of every segment of the trace, before any answer is known.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Workload {
    /// Shared system prompt with the tool definitions (ChatML system turn).
    pub system: Vec<u32>,
    /// `users[s][t]`: what turn t of session s appends after the previous
    /// answer (closing the assistant turn when t > 0, then the user turn and
    /// the assistant header); turn 0 starts with the session's history.
    pub users: Vec<Vec<Vec<u32>>>,
}

impl Workload {
    /// [`Workload::generate`] with the tokenizer of the GGUF model at `path`.
    pub fn for_model(
        path: &std::path::Path,
        seed: u64,
        shape: &WorkloadShape,
    ) -> anyhow::Result<Workload> {
        use anyhow::Context;
        let gguf = kvfabric_engine::gguf::GgufFile::open(path).context("opening the model")?;
        let tokenizer = kvfabric_engine::tokenizer::Tokenizer::from_gguf(&gguf)
            .context("building the tokenizer")?;
        drop(gguf);
        Ok(Workload::generate(
            &|text| tokenizer.encode(text, true),
            seed,
            shape,
        ))
    }

    /// Build the segments of `shape` from `seed` with tokenizer `encode`.
    pub fn generate(
        encode: &dyn Fn(&str) -> Vec<u32>,
        seed: u64,
        shape: &WorkloadShape,
    ) -> Workload {
        let mut rng = SplitMix64::new(seed);
        let head =
            "<|im_start|>system\nYou are an autonomous operations agent. Think step by step, \
                    call at most one tool per turn and answer briefly. Available tools, as JSON:\n";
        let mut text = head.to_string();
        let mut tools = 0;
        let mut system = encode(&format!("{text}<|im_end|>\n"));
        while system.len() < shape.system_tokens && tools < 1000 {
            text.push_str(&tool_definition(&mut rng, tools));
            tools += 1;
            system = encode(&format!("{text}<|im_end|>\n"));
        }
        let users = (0..shape.sessions)
            .map(|s| {
                (0..shape.turns)
                    .map(|t| {
                        let close = if t == 0 { "" } else { "<|im_end|>\n" };
                        let msg = user_message(&mut rng, s, t);
                        let mut seg = if t == 0 {
                            session_history(encode, seed, s, shape.history_tokens)
                        } else {
                            Vec::new()
                        };
                        seg.extend(encode(&format!(
                            "{close}<|im_start|>user\n{msg}<|im_end|>\n<|im_start|>assistant\n"
                        )));
                        seg
                    })
                    .collect()
            })
            .collect();
        Workload { system, users }
    }

    /// The prompt of turn `turn` given the answers of the session's earlier
    /// turns (`answers.len() == turn`).
    pub fn prompt(&self, session: usize, answers: &[Vec<u32>]) -> Vec<u32> {
        let mut p = self.system.clone();
        for (t, seg) in self.users[session]
            .iter()
            .enumerate()
            .take(answers.len() + 1)
        {
            if t > 0 {
                p.extend_from_slice(&answers[t - 1]);
            }
            p.extend_from_slice(seg);
        }
        p
    }
}

/// One finished request of a trace, in submission order.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TraceEntry {
    pub prompt: Vec<u32>,
    pub answer: Vec<u32>,
}

fn common_prefix(a: &[u32], b: &[u32]) -> usize {
    a.iter().zip(b).take_while(|(x, y)| x == y).count()
}

/// Per request, the tokens a perfect cluster-wide cache of full
/// `block_tokens` blocks could have reused (see the module doc).
pub fn oracle_cached_tokens(trace: &[TraceEntry], block_tokens: usize) -> Vec<usize> {
    let bt = block_tokens.max(1);
    let mut out = Vec::with_capacity(trace.len());
    for (i, e) in trace.iter().enumerate() {
        let usable_blocks = e.prompt.len().saturating_sub(1) / bt;
        let mut best = 0;
        for earlier in &trace[..i] {
            // Tokens of `earlier` whose KV exists: the prompt and all answer
            // tokens but the last (never fed back through the model).
            let computed = earlier.answer.len().saturating_sub(1);
            let lcp_prompt = common_prefix(&e.prompt, &earlier.prompt);
            let lcp = if lcp_prompt == earlier.prompt.len() {
                lcp_prompt + common_prefix(&e.prompt[lcp_prompt..], &earlier.answer[..computed])
            } else {
                lcp_prompt
            };
            best = best.max(lcp);
        }
        out.push((best / bt).min(usable_blocks) * bt);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn bytes(s: &str) -> Vec<u32> {
        s.bytes().map(u32::from).collect()
    }

    #[test]
    fn workload_is_deterministic_and_prompts_extend_each_other() {
        let shape = WorkloadShape {
            sessions: 3,
            turns: 4,
            system_tokens: 1000,
            history_tokens: 0,
        };
        let a = Workload::generate(&bytes, 7, &shape);
        let b = Workload::generate(&bytes, 7, &shape);
        let c = Workload::generate(&bytes, 8, &shape);
        assert_eq!(a, b);
        assert_ne!(a.system, c.system);
        assert!(a.system.len() >= 1000 && a.system.len() < 1400);
        assert_eq!(a.users.len(), 3);
        assert!(a.users.iter().all(|s| s.len() == 4));
        // Sessions differ after the shared system prompt.
        assert_ne!(a.users[0][0], a.users[1][0]);
        let answers = vec![vec![1000, 1001], vec![1002]];
        let p0 = a.prompt(1, &[]);
        let p1 = a.prompt(1, &answers[..1]);
        let p2 = a.prompt(1, &answers);
        assert_eq!(p0.len(), a.system.len() + a.users[1][0].len());
        assert!(p0.starts_with(&a.system));
        assert!(p1.starts_with(&p0) && p2.starts_with(&p1));
        assert_eq!(&p1[p0.len()..p0.len() + 2], &[1000, 1001]);
        assert_eq!(p2[p1.len()], 1002);
        assert_eq!(p2.len(), p1.len() + 1 + a.users[1][2].len());
    }

    #[test]
    fn session_history_opens_each_session_and_leaves_the_rest_alike() {
        let mut shape = WorkloadShape {
            sessions: 3,
            turns: 3,
            system_tokens: 200,
            history_tokens: 0,
        };
        let plain = Workload::generate(&bytes, 7, &shape);
        shape.history_tokens = 500;
        let with = Workload::generate(&bytes, 7, &shape);
        assert_eq!(with.system, plain.system);
        for s in 0..3 {
            let (h, p) = (&with.users[s][0], &plain.users[s][0]);
            assert!(h.len() >= p.len() + 500, "session {s}: {} tokens", h.len());
            assert!(h.ends_with(p));
            assert_eq!(with.users[s][1..], plain.users[s][1..]);
        }
        // Each session's history is its own.
        let hist = |s: usize| &with.users[s][0][..500];
        assert_ne!(hist(0), hist(1));
        assert_ne!(hist(1), hist(2));
    }

    #[test]
    fn routing_is_uniform_and_fixed_by_seed() {
        let mut counts = [0usize; 3];
        for s in 0..100 {
            for t in 0..30 {
                let e = route(5, s, t, 3);
                assert_eq!(e, route(5, s, t, 3));
                counts[e] += 1;
            }
        }
        for c in counts {
            assert!((900..1100).contains(&c), "{counts:?}");
        }
        let differs = (0..50).any(|s| route(5, s, 0, 3) != route(6, s, 0, 3));
        assert!(differs);
    }

    #[test]
    fn oracle_counts_whole_blocks_shared_with_earlier_requests() {
        let bt = 4;
        let sys: Vec<u32> = (0..10).collect(); // 2 full blocks + 2 tokens
        let mut s0t0 = sys.clone();
        s0t0.extend([100, 101, 102]); // 13 tokens
        let mut s1t0 = sys.clone();
        s1t0.extend([200, 201, 202, 203, 204]); // 15 tokens
                                                // Turn 1 of session 0: prompt + answer [50, 51, 52] + user [103, 104].
        let mut s0t1 = s0t0.clone();
        s0t1.extend([50, 51, 52, 103, 104]); // 18 tokens
        let trace = vec![
            TraceEntry {
                prompt: s0t0.clone(),
                answer: vec![50, 51, 52],
            },
            TraceEntry {
                prompt: s1t0,
                answer: vec![60, 61],
            },
            TraceEntry {
                prompt: s0t1,
                answer: vec![70],
            },
            // The same prompt again: all but the last block boundary's token.
            TraceEntry {
                prompt: s0t0,
                answer: vec![80],
            },
        ];
        let oracle = oracle_cached_tokens(&trace, bt);
        // First request: nothing earlier.
        assert_eq!(oracle[0], 0);
        // Second: shares the 10-token system prompt = 2 whole blocks.
        assert_eq!(oracle[1], 8);
        // Third: shares s0t0 (13) + answer tokens with KV (50, 51; not 52) = 15 -> 3 blocks.
        assert_eq!(oracle[2], 12);
        // Fourth: a 13-token repeat; at most (13 - 1) / 4 = 3 blocks usable.
        assert_eq!(oracle[3], 12);
        // A 12-token repeat keeps its last block to compute.
        let twelve: Vec<u32> = (0..12).collect();
        let rep = vec![
            TraceEntry {
                prompt: twelve.clone(),
                answer: vec![1],
            },
            TraceEntry {
                prompt: twelve,
                answer: vec![1],
            },
        ];
        assert_eq!(oracle_cached_tokens(&rep, bt), vec![0, 8]);
    }
}
