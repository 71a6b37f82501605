//! `kvfabric bench spec`: speculative decoding at batch 1, against decoding
//! without it and against llama.cpp's prompt lookup decoding, in one run.
//!
//! Two workloads ([`workload`]): agentic tool calling, whose answers copy
//! their context, and free chat, whose answers do not. Every prompt is
//! generated greedily until the end-of-turn token or `--max-tokens`, one at
//! a time. Figures are decode tokens/s: (tokens - 1) over the decode time,
//! summed over the workload, best of `--repeats` (a fresh engine each, so
//! no repeat drafts from an earlier one's outputs). kvfabric's decode time
//! is the time of the whole request less that of the same prompt with one
//! token (prefix cache off); llama.cpp's is timed in its generation loop,
//! first token to last. kvfabric runs with speculation off and on; the outputs
//! must be identical (`identical`). `on_resent_tps` sends the same prompts
//! again to the engine that just answered them: the drafts then come from
//! the earlier requests' outputs (the shared drafter). Acceptance length is
//! decode tokens per forward pass. `ceiling_on_vs_off` is the most prompt
//! lookup could give there with this run's verify costs ([`ceiling`]). The
//! peer is llama-cpp-python (the venv
//! `bench engine` builds) generating the same token ids with temp 0, plain
//! and with `LlamaPromptLookupDecoding` (its defaults).

mod ceiling;
mod verify_cost;
mod workload;

use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use kvfabric_engine::chat::ChatTemplate;
use kvfabric_engine::gguf::GgufFile;
use kvfabric_engine::http::EngineMetrics;
use kvfabric_engine::model::LlamaModel;
use kvfabric_engine::spec::SpecConfig;
use kvfabric_engine::tokenizer::Tokenizer;
use kvfabric_engine::{
    EngineBuilder, EngineConfig, EngineHandle, GenerationEvent, GenerationRequest, SamplingParams,
};
use serde_json::{json, Map, Value};
use tokio::sync::mpsc;

use crate::agentic::engines::stop_engine;
use crate::engine::peers::{self, LlamaCppVenv, PeerLimits};

const PEER_SCRIPT: &str = include_str!("../peers/llamacpp_spec.py");

/// Arguments of `kvfabric bench spec`.
#[derive(clap::Args, Debug, Clone)]
pub struct SpecArgs {
    /// Print one JSON object instead of a table.
    #[arg(long)]
    pub json: bool,
    /// GGUF model (default: the fetched SmolLM2-135M-Instruct Q4_1).
    #[arg(long)]
    pub model: Option<PathBuf>,
    /// Kernel threads, every engine alike (0 = one per core).
    #[arg(long, default_value_t = 0)]
    pub threads: usize,
    /// Most tokens generated per prompt.
    #[arg(long, default_value_t = 256)]
    pub max_tokens: usize,
    /// Runs of each workload per engine; the best is reported.
    #[arg(long, default_value_t = 2)]
    pub repeats: usize,
    /// Most tokens drafted per step (`[engine.spec] max_draft`; default: its default).
    #[arg(long)]
    pub max_draft: Option<usize>,
    /// Timings of one verification pass of 1 + k rows against 1 row, best
    /// of this many each (0: skip the probe).
    #[arg(long, default_value_t = 20)]
    pub verify_reps: usize,
    /// Write each workload's prompts and generated tokens (speculation off)
    /// to DIR/spec-<workload>.json, to replay drafting policies offline.
    #[arg(long, value_name = "DIR")]
    pub dump_tokens: Option<PathBuf>,
    /// Skip llama.cpp: kvfabric's figures only.
    #[arg(long)]
    pub no_peers: bool,
    /// The llama.cpp venv (default: ~/.cache/kvfabric/llamacpp-venv, built when absent).
    #[arg(long)]
    pub llamacpp_venv: Option<PathBuf>,
    /// Limit on building the llama.cpp venv, seconds.
    #[arg(long, default_value_t = 3600)]
    pub peer_build_timeout_s: u64,
    /// Limit on the llama.cpp run, seconds.
    #[arg(long, default_value_t = 1800)]
    pub peer_timeout_s: u64,
}

/// Run the bench and print its report.
pub fn run(args: &SpecArgs) -> anyhow::Result<()> {
    let report = measure(args)?;
    crate::print_report(args.json, &report, print_table)
}

/// What one kvfabric configuration gave on one workload.
#[derive(Clone, Debug, Default)]
struct Figures {
    tps: f64,
    /// Tokens generated per prompt (of the last repeat).
    tokens: Vec<Vec<u32>>,
    /// Decode tokens per forward pass.
    acceptance_length: f64,
}

/// Run the bench and return the report (what `--json` prints).
pub fn measure(args: &SpecArgs) -> anyhow::Result<Value> {
    let path = crate::model_file(&args.model)?;
    anyhow::ensure!(args.max_tokens > 1, "--max-tokens must be > 1");
    let gguf = GgufFile::open(&path).context("opening the model")?;
    let tokenizer = Tokenizer::from_gguf(&gguf).context("building the tokenizer")?;
    let template = ChatTemplate::from_gguf(&gguf, &tokenizer).context("chat template")?;
    let model = Arc::new(LlamaModel::load(&path, |_, _| {}).context("loading the model")?);
    let threads = match args.threads {
        0 => std::thread::available_parallelism().map_or(1, |n| n.get()),
        t => t,
    };
    let stop: Vec<u32> = ["<|im_end|>", "<|endoftext|>"]
        .iter()
        .filter_map(|t| tokenizer.token_id(t))
        .collect();
    let loads = workload::workloads(&tokenizer, &template)?;
    let mut report = Map::new();
    let mut measured_cost = None;
    if args.verify_reps > 0 {
        let longest = loads[0]
            .1
            .iter()
            .max_by_key(|p| p.len())
            .context("no prompt")?;
        let (cost, table) = verify_cost::measure(&model, threads, longest, args.verify_reps)?;
        report.insert("verify_cost".into(), cost);
        measured_cost = Some(table);
    }
    let (a, m, s, l) = (args.clone(), model.clone(), stop.clone(), loads.clone());
    let ours = crate::on_own_runtime(move |rt| rt.block_on(measure_ours(&a, &m, &s, &l, threads)))?;
    let peer = if args.no_peers {
        Err("skipped (--no-peers)".to_string())
    } else {
        measure_peer(args, &path, &stop, &loads, threads).map_err(|e| format!("{e:#}"))
    };
    let max_draft = args.max_draft.unwrap_or(SpecConfig::default().max_draft);
    for ((name, prompts), (off, on, resent)) in loads.iter().zip(ours) {
        if let Some(dir) = &args.dump_tokens {
            dump_tokens(dir, name, &loads, &off.tokens, &tokenizer)?;
        }
        let mut w = json!({
            "prompts": off.tokens.len(),
            "generated_tokens": off.tokens.iter().map(Vec::len).sum::<usize>(),
            "off_tps": off.tps,
            "on_tps": on.tps,
            "on_vs_off": on.tps / off.tps,
            "acceptance_length": on.acceptance_length,
            "identical": on.tokens == off.tokens && resent.tokens == off.tokens,
            "on_resent_tps": resent.tps,
            "resent_acceptance_length": resent.acceptance_length,
        });
        if let Some(cost) = &measured_cost {
            let c = ceiling::ceiling(prompts, &off.tokens, max_draft, cost);
            w["ceiling_on_vs_off"] = c["ceiling_on_vs_off"].clone();
            w["ceiling_acceptance_length"] = c["ceiling_acceptance_length"].clone();
        }
        if let Ok(p) = &peer {
            let pw = &p["workloads"][name];
            let (plain, pld) = (pw["plain_tps"].as_f64(), pw["pld_tps"].as_f64());
            w["llamacpp_tps"] = json!(plain);
            w["llamacpp_pld_tps"] = json!(pld);
            w["on_vs_llamacpp_pld"] = json!(pld.map(|x| on.tps / x));
            w["llamacpp_pld_vs_plain"] = json!(plain.zip(pld).map(|(a, b)| b / a));
            w["llamacpp_same_tokens"] = json!(pw["plain_tokens"] == json!(off.tokens));
        }
        report.insert(name.to_string(), w);
    }
    report.insert("threads".into(), json!(threads));
    report.insert("max_tokens".into(), json!(args.max_tokens));
    report.insert("repeats".into(), json!(args.repeats.max(1)));
    report.insert("max_draft".into(), json!(max_draft));
    match peer {
        Ok(p) => {
            report.insert("llamacpp_status".into(), json!("measured"));
            report.insert("llama_cpp_python".into(), p["llama_cpp_python"].clone());
        }
        Err(why) => {
            report.insert("llamacpp_status".into(), json!(why));
        }
    }
    Ok(Value::Object(report))
}

/// `[{"prompt": ids, "out": ids, "text": answer}]` of workload `name` into `dir`.
fn dump_tokens(
    dir: &std::path::Path,
    name: &str,
    loads: &[workload::Workload],
    outputs: &[Vec<u32>],
    tokenizer: &Tokenizer,
) -> anyhow::Result<()> {
    let prompts = loads.iter().find(|l| l.0 == name).map(|l| &l.1[..]);
    let items: Vec<Value> = prompts
        .unwrap_or_default()
        .iter()
        .zip(outputs)
        .map(|(p, o)| json!({"prompt": p, "out": o, "text": tokenizer.decode(o)}))
        .collect();
    std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    let path = dir.join(format!("spec-{name}.json"));
    std::fs::write(&path, json!(items).to_string())
        .with_context(|| format!("writing {}", path.display()))
}

/// Per workload: speculation off, on, and on with the prompts sent again.
async fn measure_ours(
    args: &SpecArgs,
    model: &Arc<LlamaModel>,
    stop: &[u32],
    loads: &[workload::Workload],
    threads: usize,
) -> anyhow::Result<Vec<(Figures, Figures, Figures)>> {
    let mut out = Vec::new();
    for (_, prompts) in loads {
        let mut best = [Figures::default(), Figures::default(), Figures::default()];
        for _ in 0..args.repeats.max(1) {
            for (spec, slot) in [(false, 0), (true, 1)] {
                let metrics = EngineMetrics::new();
                let cfg = EngineConfig {
                    threads,
                    kv_pool: bytesize::ByteSize::mib(256),
                    // Each prompt is sent twice (see `run_workload`), computed twice.
                    prefix_cache: false,
                    spec: SpecConfig {
                        enabled: spec,
                        max_draft: args.max_draft.unwrap_or(SpecConfig::default().max_draft),
                        ..SpecConfig::default()
                    },
                    ..EngineConfig::default()
                };
                let e = EngineBuilder::new(cfg)
                    .metrics(metrics.clone())
                    .start(model.clone())?;
                let first = run_workload(&e.handle, &metrics, prompts, args.max_tokens, stop).await;
                let again = match (&first, spec) {
                    (Ok(_), true) => Some(
                        run_workload(&e.handle, &metrics, prompts, args.max_tokens, stop).await,
                    ),
                    _ => None,
                };
                stop_engine(e).await?;
                keep_best(&mut best[slot], first?);
                if let Some(again) = again {
                    keep_best(&mut best[2], again?);
                }
            }
        }
        let [off, on, resent] = best;
        out.push((off, on, resent));
    }
    Ok(out)
}

fn keep_best(best: &mut Figures, f: Figures) {
    if f.tps > best.tps {
        *best = f;
    }
}

/// Generate every prompt in turn (batch 1).
async fn run_workload(
    engine: &EngineHandle,
    metrics: &EngineMetrics,
    prompts: &[Vec<u32>],
    max_tokens: usize,
    stop: &[u32],
) -> anyhow::Result<Figures> {
    let accepted_before = metrics.spec_accepted_tokens.get();
    let (mut n, mut t, mut tokens) = (0usize, Duration::ZERO, Vec::new());
    for p in prompts {
        // Prefill and the first token, then the whole answer: the
        // difference is the decode time (events are timed as they are
        // received, and a busy receiver takes several tokens at once).
        let (_, first) = generate(engine, p.clone(), 1, stop).await?;
        let (toks, all) = generate(engine, p.clone(), max_tokens, stop).await?;
        if toks.len() > 1 {
            n += toks.len() - 1;
            t += all.saturating_sub(first);
        }
        tokens.push(toks);
    }
    let accepted = (metrics.spec_accepted_tokens.get() - accepted_before) as usize;
    Ok(Figures {
        tps: n as f64 / t.as_secs_f64().max(1e-9),
        tokens,
        acceptance_length: n as f64 / n.saturating_sub(accepted).max(1) as f64,
    })
}

/// Greedy generation of `prompt` until a stop token or `max_tokens`: the
/// tokens and the time from submitting it to its end.
async fn generate(
    engine: &EngineHandle,
    prompt: Vec<u32>,
    max_tokens: usize,
    stop: &[u32],
) -> anyhow::Result<(Vec<u32>, Duration)> {
    let (tx, mut rx) = mpsc::channel(max_tokens + 8);
    let start = Instant::now();
    engine
        .submit(GenerationRequest {
            prompt,
            max_tokens,
            sampling: SamplingParams::default(),
            stop_token_ids: stop.to_vec(),
            namespace: b"bench-spec".to_vec(),
            owner: None,
            return_logits: false,
            forks: Vec::new(),
            events: tx,
        })
        .await?;
    let mut tokens = Vec::new();
    loop {
        match rx.recv().await {
            Some(GenerationEvent::Token { id, .. }) => tokens.push(id),
            Some(GenerationEvent::Finished { .. }) => return Ok((tokens, start.elapsed())),
            Some(GenerationEvent::Error(e)) => bail!("engine error: {e}"),
            Some(_) => {}
            None => bail!("the engine dropped the request"),
        }
    }
}

/// llama.cpp on the same token ids, plain and with prompt lookup decoding.
fn measure_peer(
    args: &SpecArgs,
    model: &std::path::Path,
    stop: &[u32],
    loads: &[workload::Workload],
    threads: usize,
) -> anyhow::Result<Value> {
    let limits = PeerLimits {
        build: Duration::from_secs(args.peer_build_timeout_s),
        run: Duration::from_secs(args.peer_timeout_s),
    };
    let dir = args
        .llamacpp_venv
        .clone()
        .unwrap_or_else(peers::default_venv);
    let venv = LlamaCppVenv::ensure(&dir, limits)?;
    let longest = loads
        .iter()
        .flat_map(|(_, p)| p.iter().map(Vec::len))
        .max()
        .unwrap_or(0);
    let workloads: Map<String, Value> = loads
        .iter()
        .map(|(name, p)| (name.to_string(), json!(p)))
        .collect();
    let job = json!({
        "model": model,
        "threads": threads,
        "repeats": args.repeats.max(1),
        "max_tokens": args.max_tokens,
        "n_ctx": (longest + args.max_tokens + 64).next_power_of_two(),
        "stop": stop,
        "workloads": workloads,
    });
    venv.run_json("llamacpp_spec.py", PEER_SCRIPT, &job, limits)
}

fn print_table(r: &Value) {
    println!(
        "{:<14} {:>9} {:>9} {:>7} {:>8} {:>8} {:>9} {:>10} {:>9}",
        "tok/s b=1",
        "spec off",
        "spec on",
        "on/off",
        "ceiling",
        "acc.len",
        "llama.cpp",
        "llama PLD",
        "resent"
    );
    for name in ["tool_calling", "free_chat"] {
        let w = &r[name];
        let f = |k: &str| w[k].as_f64().map_or("-".to_string(), |x| format!("{x:.1}"));
        let x = |k: &str| w[k].as_f64().map_or("-".into(), |x| format!("{x:.2}x"));
        println!(
            "{:<14} {:>9} {:>9} {:>7} {:>8} {:>8} {:>9} {:>10} {:>9}",
            name,
            f("off_tps"),
            f("on_tps"),
            x("on_vs_off"),
            x("ceiling_on_vs_off"),
            f("acceptance_length"),
            f("llamacpp_tps"),
            f("llamacpp_pld_tps"),
            f("on_resent_tps"),
        );
    }
    println!("llama.cpp: {}", r["llamacpp_status"]);
    if let Some(costs) = r["verify_cost"]["by_draft_len"].as_object() {
        let cells: Vec<String> = costs
            .iter()
            .map(|(k, c)| format!("{k}: {:.2}", c["vs_one_row"].as_f64().unwrap_or(f64::NAN)))
            .collect();
        println!("verify pass of 1 + k rows / 1 row: {}", cells.join(", "));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_missing_model_is_refused() {
        let args = SpecArgs {
            json: true,
            model: Some(PathBuf::from("/nonexistent/model.gguf")),
            threads: 1,
            max_tokens: 8,
            repeats: 1,
            max_draft: None,
            verify_reps: 0,
            dump_tokens: None,
            no_peers: true,
            llamacpp_venv: None,
            peer_build_timeout_s: 1,
            peer_timeout_s: 1,
        };
        assert!(measure(&args).is_err());
    }
}
