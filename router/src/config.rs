//! Router configuration (`[router]` in the kvfabric config file) and the mode
//! it implies.
//!
//! The mode is not a field of its own: it follows from which endpoint lists
//! are set (`prefill` + `decode` = disaggregated, `engines` = plain), so a
//! config cannot name a mode and then forget its endpoints. [`RouterConfig::validate`]
//! turns the lists into a [`Mode`] or a config error, once, at startup.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::PathBuf;

use hyper::Uri;
use serde::{Deserialize, Serialize};

use crate::error::{ConfigProblem, RouterError, UrlProblem};
pub use crate::pick::{PickParams, Policy};
use crate::pick::{DEFAULT_PREFIX_SESSION_WEIGHT, PREFIX_INDEX_MAX_ENGINES};

/// Settings of `kvfabric router`.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct RouterConfig {
    /// Address the router's OpenAI-compatible API listens on. Default: 127.0.0.1:8080.
    pub listen: SocketAddr,
    /// Base URLs of prefill-role engines (e.g. `http://127.0.0.1:8001`); set
    /// together with `decode` for disaggregated serving. Default: [] (none).
    pub prefill: Vec<String>,
    /// Base URLs of decode-role engines; set together with `prefill`. Default: [] (none).
    pub decode: Vec<String>,
    /// Base URLs of ordinary (role `both`) engines for plain load balancing;
    /// excludes `prefill`/`decode`. Default: [] (none).
    pub engines: Vec<String>,
    /// How an endpoint is picked: `least-loaded` (fewest in-flight tokens),
    /// `random`, `affinity` (`x-session-affinity` sticks to the engine that
    /// last served the session within a load bound) or `prefix` (the engine
    /// whose node holds the longest prefix of the prompt's blocks, weighed
    /// against its load; plain engines and the prefill hop). Default: "least-loaded".
    pub policy: String,
    /// Affinity: the session's engine is kept while its in-flight tokens are
    /// <= this x the least-loaded engine's + `affinity_load_slack_tokens`. Default: 1.5.
    pub affinity_load_factor: f64,
    /// Affinity: tokens added to the bound above. Default: 4096.
    pub affinity_load_slack_tokens: u64,
    /// Affinity: sessions remembered (least recently used forgotten first). Default: 100000.
    pub affinity_sessions: usize,
    /// Affinity: a session unused this long is forgotten, ms. Default: 600000.
    pub affinity_ttl_ms: u64,
    /// Prefix: weight of the shared prompt tokens an engine lacks against its
    /// in-flight tokens (Dynamo's overlap weight). Default: 1.0.
    pub prefix_overlap_weight: f64,
    /// Prefix: weight of the prompt's own tokens (past the prefix other
    /// prompts share: a session's history) an engine lacks. Default: 4.0.
    pub prefix_session_weight: f64,
    /// Prefix: limit on the block-keys call to an engine, ms; past it the
    /// request is routed least-loaded. Default: 2000.
    pub prefix_keys_timeout_ms: u64,
    /// Prefix: each engine's fabric node gRPC address (`host:port`), keyed
    /// by the engine's base URL as listed in `engines`, `prefill` or
    /// `decode`; the router follows that node's KV events. An engine without
    /// an entry is never known to hold anything; decode hops are routed by
    /// prefix only when some decode engine has an entry. Default: {} (none).
    pub engine_nodes: BTreeMap<String, String>,
    /// Prefix: API key sent to the nodes' KV event streams (a node with a
    /// tenants file refuses callers without one). Default: none.
    pub kv_events_api_key: Option<String>,
    /// Limit on one upstream hop (prefill, decode or plain), from sending the
    /// request to the last byte of the answer, in milliseconds. Default: 600000.
    pub request_timeout_ms: u64,
    /// Limit on opening a TCP connection to an engine, in milliseconds. Default: 2000.
    pub connect_timeout_ms: u64,
    /// Tenants file (API keys, limits; docs/SECURITY.md); the client's
    /// `Authorization` is forwarded to the engines, which check it too and
    /// pick the namespace. None: single-tenant mode. Default: none.
    pub tenants_file: Option<PathBuf>,
    /// How often the tenants file is re-read. Default: 1000 ms.
    pub tenants_reload_ms: u64,
}

impl Default for RouterConfig {
    fn default() -> Self {
        RouterConfig {
            listen: SocketAddr::from(([127, 0, 0, 1], 8080)),
            prefill: Vec::new(),
            decode: Vec::new(),
            engines: Vec::new(),
            policy: "least-loaded".into(),
            affinity_load_factor: 1.5,
            affinity_load_slack_tokens: 4096,
            affinity_sessions: 100_000,
            affinity_ttl_ms: 600_000,
            prefix_overlap_weight: 1.0,
            prefix_session_weight: DEFAULT_PREFIX_SESSION_WEIGHT,
            prefix_keys_timeout_ms: 2_000,
            engine_nodes: BTreeMap::new(),
            kv_events_api_key: None,
            request_timeout_ms: 600_000,
            connect_timeout_ms: 2_000,
            tenants_file: None,
            tenants_reload_ms: 1000,
        }
    }
}

/// What the router does with a request, with normalized base URLs
/// (`http://host:port`, no trailing slash).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Mode {
    /// Two hops: prefill on one of `prefill`, then decode on one of `decode`.
    Disaggregated {
        prefill: Vec<String>,
        decode: Vec<String>,
    },
    /// One hop to one of `engines`.
    Plain { engines: Vec<String> },
}

impl Mode {
    /// The metrics label: `disaggregated` or `plain`.
    pub fn label(&self) -> &'static str {
        match self {
            Mode::Disaggregated { .. } => "disaggregated",
            Mode::Plain { .. } => "plain",
        }
    }
}

impl RouterConfig {
    /// Check the settings and derive the mode; every problem is a
    /// [`RouterError::Config`] naming the field.
    pub fn validate(&self) -> Result<Mode, RouterError> {
        self.policy()?;
        if !(self.affinity_load_factor.is_finite() && self.affinity_load_factor >= 1.0) {
            return Err(config(ConfigProblem::Below {
                key: "affinity_load_factor",
                min: 1,
            }));
        }
        for (key, value) in [
            ("affinity_sessions", self.affinity_sessions as u64),
            ("affinity_ttl_ms", self.affinity_ttl_ms),
            ("request_timeout_ms", self.request_timeout_ms),
            ("connect_timeout_ms", self.connect_timeout_ms),
        ] {
            if value == 0 {
                return Err(config(ConfigProblem::Zero { key }));
            }
        }
        let prefill = normalize_all("prefill", &self.prefill)?;
        let decode = normalize_all("decode", &self.decode)?;
        let engines = normalize_all("engines", &self.engines)?;
        self.check_prefix(&[&prefill, &decode, &engines])?;
        match (prefill.is_empty(), decode.is_empty(), engines.is_empty()) {
            (false, false, true) => Ok(Mode::Disaggregated { prefill, decode }),
            (true, true, false) => Ok(Mode::Plain { engines }),
            (true, true, true) => Err(config(ConfigProblem::NoEndpoints)),
            (_, _, false) => Err(config(ConfigProblem::MixedModes)),
            (true, false, true) => Err(config(ConfigProblem::HalfDisaggregated {
                set: "decode",
                empty: "prefill",
            })),
            (false, true, true) => Err(config(ConfigProblem::HalfDisaggregated {
                set: "prefill",
                empty: "decode",
            })),
        }
    }

    /// The parsed `policy`.
    pub fn policy(&self) -> Result<Policy, RouterError> {
        Policy::parse(&self.policy).ok_or_else(|| {
            config(ConfigProblem::Policy {
                policy: self.policy.clone(),
            })
        })
    }

    /// The affinity / prefix tunables.
    pub fn pick_params(&self) -> PickParams {
        PickParams {
            affinity_load_factor: self.affinity_load_factor,
            affinity_load_slack_tokens: self.affinity_load_slack_tokens,
            prefix_overlap_weight: self.prefix_overlap_weight,
            prefix_session_weight: self.prefix_session_weight,
        }
    }

    /// The prefix keys: weights, timeout, and `engine_nodes` naming only
    /// engines of a prefix-routed set (`engines`, `prefill` or `decode`).
    fn check_prefix(&self, sets: &[&[String]]) -> Result<(), RouterError> {
        for (name, w) in [
            ("prefix_overlap_weight", self.prefix_overlap_weight),
            ("prefix_session_weight", self.prefix_session_weight),
        ] {
            if !(w.is_finite() && w >= 0.0) {
                return Err(config(ConfigProblem::Below { key: name, min: 0 }));
            }
        }
        if self.prefix_keys_timeout_ms == 0 {
            return Err(config(ConfigProblem::Zero {
                key: "prefix_keys_timeout_ms",
            }));
        }
        let too_many = sets.iter().any(|s| s.len() > PREFIX_INDEX_MAX_ENGINES);
        if self.policy == Policy::Prefix.as_str() && too_many {
            return Err(config(ConfigProblem::PrefixSetTooLarge {
                max: PREFIX_INDEX_MAX_ENGINES,
            }));
        }
        for (url, node) in &self.engine_nodes {
            let base = normalize(url).map_err(|why| {
                config(ConfigProblem::Url {
                    field: "engine_nodes",
                    url: url.clone(),
                    why,
                })
            })?;
            if !sets.iter().any(|s| s.contains(&base)) {
                return Err(config(ConfigProblem::UnknownEngine { url: url.clone() }));
            }
            if node.is_empty() || node.contains('/') {
                return Err(config(ConfigProblem::NodeAddress {
                    url: url.clone(),
                    node: node.clone(),
                }));
            }
        }
        Ok(())
    }

    /// Each engine's node gRPC address, by normalized engine URL.
    pub fn node_of(&self, engine: &str) -> Option<&str> {
        self.engine_nodes
            .iter()
            .find(|(url, _)| normalize(url).is_ok_and(|u| u == engine))
            .map(|(_, node)| node.as_str())
    }
}

fn config(problem: ConfigProblem) -> RouterError {
    RouterError::Config(problem)
}

fn normalize_all(field: &'static str, urls: &[String]) -> Result<Vec<String>, RouterError> {
    let mut out: Vec<String> = Vec::with_capacity(urls.len());
    for url in urls {
        let url = url.clone();
        let base = match normalize(&url) {
            Ok(base) => base,
            Err(why) => return Err(config(ConfigProblem::Url { field, url, why })),
        };
        if out.contains(&base) {
            return Err(config(ConfigProblem::Duplicate { field, url }));
        }
        out.push(base);
    }
    Ok(out)
}

/// `http://host:port[/]` -> `http://host:port`; anything else is refused.
fn normalize(url: &str) -> Result<String, UrlProblem> {
    let uri: Uri = url.parse().map_err(|_| UrlProblem::NotAUrl)?;
    if uri.scheme_str() != Some("http") {
        return Err(UrlProblem::NotHttp);
    }
    let authority = uri.authority().ok_or(UrlProblem::NoHost)?;
    if !matches!(uri.path(), "" | "/") || uri.query().is_some() {
        return Err(UrlProblem::HasPath);
    }
    Ok(format!("http://{authority}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn with(prefill: &[&str], decode: &[&str], engines: &[&str]) -> RouterConfig {
        let own = |v: &[&str]| v.iter().map(|s| s.to_string()).collect();
        RouterConfig {
            prefill: own(prefill),
            decode: own(decode),
            engines: own(engines),
            ..RouterConfig::default()
        }
    }

    #[test]
    fn defaults_round_trip_and_unknown_fields_are_refused() {
        let c = RouterConfig::default();
        let back: RouterConfig =
            serde_json::from_str(&serde_json::to_string(&c).expect("ser")).expect("de");
        assert_eq!(back, c);
        let partial: RouterConfig =
            serde_json::from_str(r#"{"engines": ["http://127.0.0.1:8000"]}"#).expect("partial");
        assert_eq!(partial.policy, "least-loaded");
        assert_eq!(partial.request_timeout_ms, 600_000);
        assert_eq!(partial.connect_timeout_ms, 2_000);
        assert_eq!(partial.listen, SocketAddr::from(([127, 0, 0, 1], 8080)));
        assert!(serde_json::from_str::<RouterConfig>(r#"{"engine": []}"#).is_err());
    }

    #[test]
    fn mode_follows_from_the_endpoint_lists() {
        let m = with(&["http://a:1/"], &["http://b:2"], &[])
            .validate()
            .expect("disaggregated");
        assert_eq!(
            m,
            Mode::Disaggregated {
                prefill: vec!["http://a:1".into()],
                decode: vec!["http://b:2".into()],
            }
        );
        let m = with(&[], &[], &["http://a:1", "http://b:2"])
            .validate()
            .expect("plain");
        assert_eq!(m.label(), "plain");
        for bad in [
            with(&[], &[], &[]),
            with(&["http://a:1"], &[], &[]),
            with(&[], &["http://a:1"], &[]),
            with(&["http://a:1"], &["http://b:1"], &["http://c:1"]),
            with(&[], &[], &["a:1"]),
            with(&[], &[], &["https://a:1"]),
            with(&[], &[], &["http://a:1/v1"]),
            with(&[], &[], &["http://a:1", "http://a:1/"]),
        ] {
            let e = bad.validate().expect_err("refused");
            assert!(matches!(e, RouterError::Config(_)), "{e:?}");
        }
    }

    /// A refused setting is a typed problem naming the field, and reads as
    /// "router config: <what is wrong>".
    #[test]
    fn refused_settings_name_the_field() {
        let problem = |c: RouterConfig| match c.validate() {
            Err(RouterError::Config(p)) => p,
            other => panic!("expected a config error, got {other:?}"),
        };
        let p = problem(with(&[], &["http://a:1"], &[]));
        assert_eq!(
            RouterError::Config(p).to_string(),
            "router config: decode is set but prefill is empty"
        );
        let p = problem(with(&[], &[], &["https://a:1"]));
        assert_eq!(
            p,
            ConfigProblem::Url {
                field: "engines",
                url: "https://a:1".into(),
                why: UrlProblem::NotHttp,
            }
        );
        assert_eq!(
            p.to_string(),
            "engines: \"https://a:1\": only http:// engines are supported"
        );
        let mut c = with(&[], &[], &["http://a:1"]);
        c.affinity_ttl_ms = 0;
        assert_eq!(
            problem(c),
            ConfigProblem::Zero {
                key: "affinity_ttl_ms"
            }
        );
    }

    #[test]
    fn prefix_policy_and_its_keys_are_accepted_and_checked() {
        let mut c = with(&[], &[], &["http://a:1", "http://b:2"]);
        c.policy = "prefix".into();
        c.engine_nodes = [("http://a:1/".to_string(), "127.0.0.1:50051".to_string())].into();
        c.prefix_overlap_weight = 2.0;
        assert_eq!(c.policy().expect("prefix"), Policy::Prefix);
        c.validate().expect("valid");
        assert_eq!(c.node_of("http://a:1"), Some("127.0.0.1:50051"));
        assert_eq!(c.node_of("http://b:2"), None);
        let p = c.pick_params();
        assert_eq!(
            (p.prefix_overlap_weight, p.prefix_session_weight),
            (2.0, DEFAULT_PREFIX_SESSION_WEIGHT)
        );
        let defaults: RouterConfig =
            serde_json::from_str(r#"{"engines": ["http://a:1"], "policy": "prefix"}"#).expect("de");
        assert_eq!(defaults.prefix_overlap_weight, 1.0);
        assert_eq!(defaults.prefix_session_weight, 4.0);
        assert_eq!(defaults.prefix_keys_timeout_ms, 2_000);
        defaults.validate().expect("no engine_nodes is valid");
        let bad = |f: &dyn Fn(&mut RouterConfig)| {
            let mut b = c.clone();
            f(&mut b);
            assert!(b.validate().is_err(), "{b:?}");
        };
        bad(&|b| b.prefix_overlap_weight = -1.0);
        bad(&|b| b.prefix_session_weight = f64::NAN);
        bad(&|b| b.prefix_keys_timeout_ms = 0);
        bad(&|b| b.engine_nodes = [("http://c:3".into(), "127.0.0.1:1".into())].into());
        bad(&|b| b.engine_nodes = [("http://a:1".into(), "http://127.0.0.1:1".into())].into());
        // Disaggregated: prefill and decode engines may both have nodes.
        let mut d = with(&["http://p:1"], &["http://d:1"], &[]);
        d.policy = "prefix".into();
        d.engine_nodes = [("http://p:1".to_string(), "127.0.0.1:5".to_string())].into();
        d.validate().expect("prefill engines may have nodes");
        d.engine_nodes = [("http://d:1".to_string(), "127.0.0.1:5".to_string())].into();
        d.validate().expect("decode engines may have nodes");
        d.engine_nodes = [("http://x:1".to_string(), "127.0.0.1:5".to_string())].into();
        assert!(d.validate().is_err(), "not an engine of either set");
    }

    #[test]
    fn policy_and_timeouts_are_checked() {
        let mut c = with(&[], &[], &["http://a:1"]);
        c.policy = "random".into();
        assert_eq!(c.policy().expect("random"), Policy::Random);
        c.policy = "affinity".into();
        assert_eq!(c.policy().expect("affinity"), Policy::Affinity);
        c.affinity_load_factor = 0.5;
        assert!(c.validate().is_err());
        c.affinity_load_factor = 1.5;
        c.affinity_sessions = 0;
        assert!(c.validate().is_err());
        c.affinity_sessions = 10;
        c.policy = "round-robin".into();
        assert!(c.validate().is_err());
        let mut c = with(&[], &[], &["http://a:1"]);
        c.request_timeout_ms = 0;
        assert!(c.validate().is_err());
        let mut c = with(&[], &[], &["http://a:1"]);
        c.connect_timeout_ms = 0;
        assert!(c.validate().is_err());
    }
}
