//! Drives engines in-process at the token level (no HTTP): one request
//! ([`generate`]: submit, stream, time to first token, usage), and one
//! configuration's run of the agentic trace ([`drive`]: sessions whose next
//! turn is ready are sent at most `rate` per second, each request routed to
//! the engine [`route`] picks, a session's next turn built from its answer;
//! sessions join one after another unless `burst_start`).

use std::collections::VecDeque;
use std::time::{Duration, Instant};

use anyhow::{anyhow, bail};
use kvfabric_engine::{EngineHandle, GenerationEvent, GenerationRequest, SamplingParams, Usage};
use tokio::sync::mpsc;
use tokio::task::JoinSet;

use super::stats::RequestRecord;
use super::trace::{route, Workload};

/// What one request produced.
#[derive(Clone, Debug)]
pub struct Completion {
    pub tokens: Vec<u32>,
    /// Logits row of the first generated token (when asked for).
    pub first_logits: Option<Vec<f32>>,
    pub ttft: Duration,
    pub e2e: Duration,
    pub usage: Usage,
}

/// Send `prompt` to `engine`, greedy, exactly `max_tokens` tokens (no stop
/// tokens), and wait for the end.
pub async fn generate(
    engine: &EngineHandle,
    prompt: Vec<u32>,
    max_tokens: usize,
    return_logits: bool,
) -> anyhow::Result<Completion> {
    let (tx, mut rx) = mpsc::channel(max_tokens + 8);
    let start = Instant::now();
    engine
        .submit(GenerationRequest {
            prompt,
            max_tokens,
            sampling: SamplingParams::default(),
            stop_token_ids: Vec::new(),
            namespace: Vec::new(),
            return_logits,
            events: tx,
        })
        .await?;
    let mut tokens = Vec::with_capacity(max_tokens);
    let mut first_logits = None;
    let mut ttft = None;
    loop {
        match rx.recv().await {
            Some(GenerationEvent::Token { id, logits }) => {
                if ttft.is_none() {
                    ttft = Some(start.elapsed());
                    first_logits = logits;
                }
                tokens.push(id);
            }
            Some(GenerationEvent::Saved(_)) => {}
            Some(GenerationEvent::Finished { usage, .. }) => {
                let e2e = start.elapsed();
                return Ok(Completion {
                    tokens,
                    first_logits,
                    ttft: ttft.unwrap_or(e2e),
                    e2e,
                    usage,
                });
            }
            Some(GenerationEvent::Error(e)) => bail!("engine error: {e}"),
            None => bail!("the engine dropped the request"),
        }
    }
}

/// How one configuration replays the trace.
#[derive(Clone, Debug)]
pub struct DriveParams {
    /// Most requests sent per second; 0 = as soon as a turn is ready.
    pub rate: f64,
    /// Tokens generated per turn.
    pub answer_tokens: usize,
    /// Seed of the routing.
    pub seed: u64,
    /// Start every session at once; otherwise (ramp-up) session s+1 starts
    /// when session s's first turn has finished, as users join a running
    /// service whose shared system prompt is already computed somewhere.
    pub burst_start: bool,
}

struct Sent {
    index: usize,
    session: usize,
    turn: usize,
    engine: usize,
    prompt: Vec<u32>,
}

/// Run every turn of every session of `workload` on `engines`; records in
/// submission order and the wall time of the whole run.
pub async fn drive(
    engines: &[EngineHandle],
    workload: &Workload,
    p: &DriveParams,
) -> anyhow::Result<(Vec<RequestRecord>, Duration)> {
    if engines.is_empty() {
        bail!("no engines to drive");
    }
    let sessions = workload.users.len();
    let turns = workload.users.first().map_or(0, Vec::len);
    let total = sessions * turns;
    let interval = if p.rate > 0.0 {
        Duration::from_secs_f64(1.0 / p.rate)
    } else {
        Duration::ZERO
    };
    let first_ready = if p.burst_start {
        sessions
    } else {
        sessions.min(1)
    };
    let mut ready: VecDeque<usize> = (0..first_ready).collect();
    let mut next_session = first_ready;
    let mut answers: Vec<Vec<Vec<u32>>> = vec![Vec::new(); sessions];
    let mut records: Vec<(usize, RequestRecord)> = Vec::with_capacity(total);
    let mut in_flight: JoinSet<(Sent, anyhow::Result<Completion>)> = JoinSet::new();
    let start = Instant::now();
    let mut next_send = start;
    let mut sent = 0;
    while records.len() < total {
        if turns > 0 && Instant::now() >= next_send {
            if let Some(session) = ready.pop_front() {
                let turn = answers[session].len();
                let engine = route(p.seed, session, turn, engines.len());
                let prompt = workload.prompt(session, &answers[session]);
                let handle = engines[engine].clone();
                let meta = Sent {
                    index: sent,
                    session,
                    turn,
                    engine,
                    prompt: prompt.clone(),
                };
                let answer_tokens = p.answer_tokens;
                in_flight.spawn(async move {
                    let r = generate(&handle, prompt, answer_tokens, false).await;
                    (meta, r)
                });
                sent += 1;
                // Idle time (no turn ready) does not bank a burst.
                next_send = next_send.max(Instant::now()) + interval;
                continue;
            }
        }
        let wake = if ready.is_empty() {
            if in_flight.is_empty() {
                bail!("no request in flight and no session ready");
            }
            None
        } else {
            Some(tokio::time::Instant::from_std(next_send))
        };
        tokio::select! {
            joined = in_flight.join_next(), if !in_flight.is_empty() => {
                let Some(joined) = joined else {
                    continue;
                };
                let (meta, result) = joined.map_err(|e| anyhow!("request task: {e}"))?;
                let done = result?;
                answers[meta.session].push(done.tokens.clone());
                if meta.turn == 0 && next_session < sessions {
                    ready.push_back(next_session);
                    next_session += 1;
                }
                if meta.turn + 1 < turns {
                    ready.push_back(meta.session);
                }
                records.push((
                    meta.index,
                    RequestRecord {
                        session: meta.session,
                        turn: meta.turn,
                        engine: meta.engine,
                        prompt: meta.prompt,
                        answer: done.tokens,
                        cached_tokens: done.usage.cached_tokens,
                        ttft: done.ttft,
                        e2e: done.e2e,
                    },
                ));
            }
            _ = async {
                match wake {
                    Some(t) => tokio::time::sleep_until(t).await,
                    None => std::future::pending::<()>().await,
                }
            } => {}
        }
    }
    let wall = start.elapsed();
    records.sort_by_key(|(i, _)| *i);
    Ok((records.into_iter().map(|(_, r)| r).collect(), wall))
}
