//! Drives engines in-process at the token level (no HTTP): one request
//! ([`generate`]: submit, stream, time to first token, usage), and one
//! configuration's run of the agentic trace ([`drive`]: sessions whose next
//! turn is ready are sent at most `rate` per second, each request routed to
//! the engine the [`BenchRouter`] picks, a session's next turn built from its answer;
//! sessions join one after another unless `burst_start`).

use std::collections::VecDeque;
use std::time::{Duration, Instant};

use anyhow::{anyhow, bail};
use kvfabric_engine::{EngineHandle, GenerationEvent, GenerationRequest, SamplingParams, Usage};
use tokio::sync::mpsc;
use tokio::task::JoinSet;

use super::routing::BenchRouter;
use super::stats::RequestRecord;
use super::trace::Workload;

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
            owner: None,
            return_logits,
            forks: Vec::new(),
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
            Some(GenerationEvent::Saved(_) | GenerationEvent::Admitted { .. }) => {}
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
    /// Reserved on the engine until the turn finishes.
    tokens: u64,
}

impl Sent {
    /// The record of this request, answered by `done`, with its submission
    /// index.
    fn record(self, done: Completion) -> (usize, RequestRecord) {
        let record = RequestRecord {
            session: self.session,
            turn: self.turn,
            engine: self.engine,
            prompt: self.prompt,
            answer: done.tokens,
            cached_tokens: done.usage.cached_tokens,
            ttft: done.ttft,
            e2e: done.e2e,
        };
        (self.index, record)
    }
}

/// Run every turn of every session of `workload` on `engines`, routed by
/// `router`; records in submission order and the wall time of the whole run.
pub async fn drive(
    engines: &[EngineHandle],
    workload: &Workload,
    p: &DriveParams,
    router: &mut BenchRouter,
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
                let prompt = workload.prompt(session, &answers[session]);
                let tokens = (prompt.len() + p.answer_tokens) as u64;
                let (engine, tokens) = router.pick(session, turn, &prompt, tokens);
                let engine = engine % engines.len();
                let handle = engines[engine].clone();
                let meta = Sent {
                    index: sent,
                    session,
                    turn,
                    engine,
                    prompt: prompt.clone(),
                    tokens,
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
                router.release(meta.engine, meta.tokens);
                let done = result?;
                answers[meta.session].push(done.tokens.clone());
                if meta.turn == 0 && next_session < sessions {
                    ready.push_back(next_session);
                    next_session += 1;
                }
                if meta.turn + 1 < turns {
                    ready.push_back(meta.session);
                }
                records.push(meta.record(done));
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

#[cfg(test)]
mod tests {
    use std::sync::{Arc, Mutex};

    use kvfabric_engine::{FinishReason, GenerationRequest};

    use super::*;
    use crate::agentic::trace::{route, WorkloadShape};
    use kvfabric_router::pick::{PickParams, Policy};

    fn random(seed: u64, engines: usize) -> BenchRouter {
        BenchRouter::new(Policy::Random, PickParams::default(), seed, engines, None)
    }

    fn shape(sessions: usize, turns: usize, system_tokens: usize) -> WorkloadShape {
        WorkloadShape {
            sessions,
            turns,
            system_tokens,
            history_tokens: 0,
        }
    }

    /// (engine, arrival time, prompt) of every request, in arrival order.
    type RequestLog = Arc<Mutex<Vec<(usize, Instant, Vec<u32>)>>>;

    /// An engine stand-in for the driver's own logic: answers every request
    /// with `answer_tokens` ids derived from the prompt, after `delay`, and
    /// logs (engine, arrival time, prompt).
    fn fake_engine(id: usize, delay: Duration, log: RequestLog) -> EngineHandle {
        let (tx, mut rx) = mpsc::channel::<GenerationRequest>(16);
        tokio::spawn(async move {
            while let Some(r) = rx.recv().await {
                log.lock()
                    .unwrap()
                    .push((id, Instant::now(), r.prompt.clone()));
                let log_len = r.prompt.len() as u32;
                tokio::spawn(async move {
                    tokio::time::sleep(delay).await;
                    for i in 0..r.max_tokens as u32 {
                        let ev = GenerationEvent::Token {
                            id: 50_000 + log_len + i,
                            logits: None,
                        };
                        if r.events.send(ev).await.is_err() {
                            return;
                        }
                    }
                    let usage = Usage {
                        prompt_tokens: r.prompt.len(),
                        completion_tokens: r.max_tokens,
                        cached_tokens: 7,
                    };
                    let _ = r
                        .events
                        .send(GenerationEvent::Finished {
                            reason: FinishReason::Length,
                            usage,
                        })
                        .await;
                });
            }
        });
        EngineHandle::new(tx)
    }

    fn bytes(s: &str) -> Vec<u32> {
        s.bytes().map(u32::from).collect()
    }

    #[tokio::test]
    async fn drive_builds_histories_routes_ramps_up_and_keeps_the_rate() {
        let log = Arc::new(Mutex::new(Vec::new()));
        let engines: Vec<EngineHandle> = (0..3)
            .map(|i| fake_engine(i, Duration::from_millis(20), log.clone()))
            .collect();
        let workload = Workload::generate(&bytes, 3, &shape(3, 3, 200));
        let rate = 20.0;
        let p = DriveParams {
            rate,
            answer_tokens: 4,
            seed: 9,
            burst_start: false,
        };
        let (records, wall) = drive(&engines, &workload, &p, &mut random(9, 3))
            .await
            .expect("drive");
        assert_eq!(records.len(), 9);
        assert!(wall > Duration::ZERO);
        for r in &records {
            assert_eq!(r.engine, route(9, r.session, r.turn, 3));
            assert_eq!(r.answer.len(), 4);
            assert_eq!(r.answer[0], 50_000 + r.prompt.len() as u32);
            assert_eq!(r.cached_tokens, 7);
            assert!(r.ttft <= r.e2e);
            // The prompt is the system prompt + the session's turns and answers so far.
            let answers: Vec<Vec<u32>> = records
                .iter()
                .filter(|x| x.session == r.session && x.turn < r.turn)
                .map(|x| (x.turn, x.answer.clone()))
                .collect::<std::collections::BTreeMap<_, _>>()
                .into_values()
                .collect();
            assert_eq!(r.prompt, workload.prompt(r.session, &answers));
        }
        let log = log.lock().unwrap();
        assert_eq!(log.len(), 9);
        // Submission order = arrival order; at most `rate` per second (each
        // gap with room for scheduling jitter, the whole span exactly).
        for w in log.windows(2) {
            let gap = w[1].1 - w[0].1;
            assert!(gap >= Duration::from_secs_f64(0.5 / rate), "gap {gap:?}");
        }
        let span = log[8].1 - log[0].1;
        assert!(
            span >= Duration::from_secs_f64(8.0 / rate * 0.95),
            "span {span:?}"
        );
        for (r, (engine, _, prompt)) in records.iter().zip(log.iter()) {
            assert_eq!((r.engine, &r.prompt), (*engine, prompt));
        }
        // Ramp-up: session s+1's first turn is sent after session s's first answer.
        let first = |s: usize| records.iter().position(|r| r.session == s && r.turn == 0);
        assert!(first(0) < first(1) && first(1) < first(2));
        let s0_t0 = records
            .iter()
            .position(|r| r.session == 0 && r.turn == 0)
            .unwrap();
        let s1_t0 = first(1).unwrap();
        assert!(log[s1_t0].1 >= log[s0_t0].1 + Duration::from_millis(20));
    }

    #[tokio::test]
    async fn drive_reports_engine_errors_and_needs_engines() {
        let workload = Workload::generate(&bytes, 3, &shape(1, 1, 10));
        let p = DriveParams {
            rate: 0.0,
            answer_tokens: 2,
            seed: 1,
            burst_start: true,
        };
        assert!(drive(&[], &workload, &p, &mut random(1, 1)).await.is_err());
        let (tx, mut rx) = mpsc::channel::<GenerationRequest>(4);
        tokio::spawn(async move {
            while let Some(r) = rx.recv().await {
                let _ = r
                    .events
                    .send(GenerationEvent::Error("prompt too long".into()))
                    .await;
            }
        });
        let err = drive(&[EngineHandle::new(tx)], &workload, &p, &mut random(1, 1))
            .await
            .expect_err("engine error must fail the run");
        assert!(err.to_string().contains("prompt too long"), "{err}");
        // An engine that shut down.
        let (tx, rx) = mpsc::channel::<GenerationRequest>(4);
        drop(rx);
        assert!(
            drive(&[EngineHandle::new(tx)], &workload, &p, &mut random(1, 1))
                .await
                .is_err()
        );
    }
}
