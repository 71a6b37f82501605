//! The live `prefix` policy's inputs: for each request, its block keys
//! (asked of an engine) matched against the [`PrefixIndex`] the nodes' KV
//! events build (`kv_events.rs`), and which of its blocks other prompts
//! share ([`PrefixBranches`] of the prompts routed). The cost and the pick
//! are `pick.rs`'s pure [`crate::pick::choose`], the same code `kvfabric
//! bench agentic --routing prefix` routes with; this file only gathers what
//! it needs.
//!
//! Keys: the router has no tokenizer, chat template, model fingerprint or KV
//! layout, so it asks an engine ([`KeysClient`], one for every set of the
//! router): `POST /v1/kvfabric/keys/<api path>` with
//! the client's body and `Authorization` (the tenant and `cache_salt` pick
//! the namespace), answered with the keys that engine would look up and
//! save. One call per request, to the engine least loaded at that moment:
//! engines of one routed set serve one model with one `block_tokens` and KV
//! dtype, so any of them names the blocks alike (engines that differ would
//! name different keys, and their nodes would never match: the policy then
//! degrades to least-loaded, still correct). If the call fails (engine down,
//! timeout, a 4xx for a body the real endpoint will refuse too, an engine
//! without the route), the request is routed least-loaded and counted in
//! `prefix_fallbacks_total`.

use std::sync::{Arc, Mutex};

use axum::http::Method;
use serde_json::Value;
use tokio::task::JoinHandle;

use crate::balance::{EndpointSet, PrefixHint};
use crate::error::{AnswerProblem, RouterError};
use crate::kv_events::{self, NodeClient};
use crate::metrics::RouterMetrics;
use crate::pick::{PrefixBranches, PrefixIndex};
use crate::proxy::Upstream;
use crate::request::{Api, ClientRequest};

/// Block keys remembered by the branch tree before it starts over.
const BRANCH_KEYS: usize = 1 << 20;

/// A request's block keys, asked of an engine once and used by each hop.
#[derive(Debug)]
pub(crate) struct RequestKeys {
    keys: Vec<[u8; 32]>,
    block_tokens: usize,
}

/// Asks engines for a request's block keys (one client for every set).
#[derive(Debug)]
pub(crate) struct KeysClient {
    upstream: Upstream,
}

/// Prefix routing for one endpoint set (plain, prefill or decode engines).
#[derive(Debug)]
pub(crate) struct PrefixRouting {
    index: Arc<Mutex<PrefixIndex>>,
    branches: Mutex<PrefixBranches>,
    tasks: Vec<JoinHandle<()>>,
}

impl Drop for PrefixRouting {
    fn drop(&mut self) {
        for t in &self.tasks {
            t.abort();
        }
    }
}

impl PrefixRouting {
    /// Follow the node of each of `urls` that `node_of` names.
    pub fn start(
        urls: &[String],
        node_of: impl Fn(&str) -> Option<String>,
        client: NodeClient,
        metrics: &RouterMetrics,
    ) -> PrefixRouting {
        let index = Arc::new(Mutex::new(PrefixIndex::new()));
        let tasks = urls
            .iter()
            .enumerate()
            .filter_map(|(i, url)| {
                let node = node_of(url)?;
                Some(kv_events::follow(
                    i,
                    node,
                    client.clone(),
                    index.clone(),
                    metrics.clone(),
                ))
            })
            .collect();
        PrefixRouting {
            index,
            branches: Mutex::new(PrefixBranches::new(BRANCH_KEYS)),
            tasks,
        }
    }

    /// What each of `engines` engines holds of the prompt `keys` names;
    /// the keys are recorded in this set's branch tree.
    pub fn hint(&self, keys: &RequestKeys, engines: usize) -> PrefixHint {
        let (keys, block_tokens) = (&keys.keys, keys.block_tokens);
        let shared = self
            .branches
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .observe(keys);
        let ix = kv_events::lock(&self.index);
        PrefixHint {
            cached: ix.cached_blocks(keys, engines),
            own_held: ix.held_blocks(&keys[shared.min(keys.len())..], engines),
            blocks: keys.len(),
            shared,
            block_tokens,
        }
    }
}

impl KeysClient {
    /// Keys calls through `upstream` (its timeouts bound each call).
    pub fn new(upstream: Upstream) -> KeysClient {
        KeysClient { upstream }
    }

    /// `req`'s block keys, asked of `set`'s least loaded engine; None
    /// (counted) when the call fails.
    pub async fn request_keys(
        &self,
        set: &EndpointSet,
        req: &ClientRequest,
        metrics: &RouterMetrics,
    ) -> Option<RequestKeys> {
        let engine = set.least_loaded_url();
        match self.block_keys(&engine, req).await {
            Ok((keys, block_tokens)) => Some(RequestKeys { keys, block_tokens }),
            Err(e) => {
                tracing::warn!(error = %e, "block keys unavailable; routing least-loaded");
                metrics.prefix_fallbacks.inc();
                None
            }
        }
    }

    /// The engine's answer to the keys call: (keys in chain order, block_tokens).
    async fn block_keys(
        &self,
        engine: &str,
        req: &ClientRequest,
    ) -> Result<(Vec<[u8; 32]>, usize), RouterError> {
        let path = keys_path(req.api);
        let answer = self
            .upstream
            .send(
                Method::POST,
                engine,
                path,
                req.original_body(),
                &req.headers,
            )
            .await?
            .collect()
            .await?;
        if !answer.status.is_success() {
            return Err(RouterError::Status {
                endpoint: engine.to_owned(),
                status: answer.status,
                message: answer.error_message(),
            });
        }
        parse_keys(&answer.bytes).map_err(|problem| RouterError::BadAnswer {
            endpoint: engine.to_owned(),
            problem,
        })
    }
}

/// The engine's keys route for a client API.
pub(crate) fn keys_path(api: Api) -> &'static str {
    match api {
        Api::Chat => "/v1/kvfabric/keys/chat/completions",
        Api::Completion => "/v1/kvfabric/keys/completions",
    }
}

/// `{"block_tokens": n, "block_keys": ["<64 hex>", ...]}` -> keys, n.
pub(crate) fn parse_keys(bytes: &[u8]) -> Result<(Vec<[u8; 32]>, usize), AnswerProblem> {
    let v: Value = serde_json::from_slice(bytes).map_err(|source| AnswerProblem::NotJson {
        what: "keys answer",
        source,
    })?;
    let block_tokens = v["block_tokens"]
        .as_u64()
        .filter(|&n| n > 0)
        .ok_or(AnswerProblem::NoBlockTokens)? as usize;
    let keys = v["block_keys"]
        .as_array()
        .ok_or(AnswerProblem::NoBlockKeys)?
        .iter()
        .map(|k| {
            k.as_str()
                .and_then(key_from_hex)
                .ok_or(AnswerProblem::BadKey)
        })
        .collect::<Result<Vec<_>, _>>()?;
    Ok((keys, block_tokens))
}

fn key_from_hex(s: &str) -> Option<[u8; 32]> {
    let b = s.as_bytes();
    if b.len() != 64 {
        return None;
    }
    let nibble = |c: u8| (c as char).to_digit(16).map(|d| d as u8);
    let mut out = [0u8; 32];
    for (i, o) in out.iter_mut().enumerate() {
        *o = (nibble(b[2 * i])? << 4) | nibble(b[2 * i + 1])?;
    }
    Some(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_answers_parse_and_bad_ones_are_refused() {
        let body = serde_json::json!({
            "object": "kvfabric.block_keys",
            "block_tokens": 64,
            "block_keys": ["ab".repeat(32), "0F".repeat(32)],
        });
        let (keys, bt) = parse_keys(body.to_string().as_bytes()).expect("parse");
        assert_eq!(bt, 64);
        assert_eq!(keys, vec![[0xab; 32], [0x0f; 32]]);
        for bad in [
            serde_json::json!({"block_tokens": 64, "block_keys": ["ab"]}),
            serde_json::json!({"block_tokens": 64, "block_keys": ["zz".repeat(32)]}),
            serde_json::json!({"block_tokens": 0, "block_keys": []}),
            serde_json::json!({"block_keys": []}),
        ] {
            assert!(parse_keys(bad.to_string().as_bytes()).is_err(), "{bad}");
        }
        assert!(parse_keys(b"not json").is_err());
    }
}
