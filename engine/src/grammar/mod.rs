//! Grammar-constrained decoding: `response_format` (`json_object`,
//! `json_schema`) and forced tool calls, enforced by masking the logits.
//!
//! The grammar engine is llguidance (the one vLLM, SGLang and llama.cpp
//! share): an Earley parser over a lazily built lexer, which computes the
//! set of allowed next tokens by walking a trie of the vocabulary
//! ([`vocab`]) instead of testing 49k tokens one by one. This module owns
//! the three stages:
//!
//! * [`Grammars`] (one per engine, in the HTTP state): the token trie and
//!   llguidance's parser factory, built on first use, and compiled grammars
//!   cached by the hash of their source, so a schema sent with every
//!   request compiles once.
//! * [`Constraint`] (rides in [`SamplingParams`](crate::SamplingParams),
//!   so every fork of an `n > 1` request carries it): a compiled grammar
//!   in its start state.
//! * [`GrammarMatcher`] (one per sample, in the scheduler's sequence):
//!   before each token it sets every logit the grammar forbids to -inf,
//!   in the very row the sampler (and `logprobs`) then reads, and after
//!   the token it advances the parser. A grammar that can end allows the
//!   stop ids; one that cannot continue ends the sample (`stop`).
//!
//! JSON is generated compact (`", "` and `": "` separators, no other
//! whitespace) unless the schema's own `x-guidance` says otherwise, so a
//! sampled answer cannot wander into runs of whitespace.

mod vocab;

use std::collections::HashMap;
use std::fmt;
use std::sync::{Arc, Mutex, OnceLock};

use llguidance::api::TopLevelGrammar;
use llguidance::{Matcher, ParserFactory};
use serde_json::{json, Value};
use toktrie::SimpleVob;

use crate::tokenizer::Tokenizer;
use crate::{EngineError, GrammarFault, LibraryError};

/// Compiled grammars kept; past this the cache starts over.
const CACHE_ENTRIES: usize = 256;

/// What to constrain the output to.
#[derive(Clone, Debug, PartialEq)]
pub enum GrammarSpec {
    /// A JSON schema (`{"type": "object"}` for `json_object`).
    JsonSchema(Value),
    /// llguidance's Lark dialect (may embed schemas as `%json {..}`).
    Lark(String),
}

impl GrammarSpec {
    /// A JSON schema, with the compact separators unless it sets its own
    /// `x-guidance` options.
    pub fn json_schema(schema: Value) -> GrammarSpec {
        GrammarSpec::JsonSchema(compact(schema))
    }

    fn key(&self) -> [u8; 32] {
        let mut h = blake3::Hasher::new();
        match self {
            GrammarSpec::JsonSchema(v) => {
                h.update(b"json\0");
                h.update(v.to_string().as_bytes());
            }
            GrammarSpec::Lark(s) => {
                h.update(b"lark\0");
                h.update(s.as_bytes());
            }
        }
        *h.finalize().as_bytes()
    }
}

/// `schema` with llguidance's compact JSON options added (an object schema
/// without `x-guidance` only; anything else is returned as is).
pub fn compact(mut schema: Value) -> Value {
    if let Some(obj) = schema.as_object_mut() {
        obj.entry("x-guidance").or_insert_with(
            || json!({"whitespace_flexible": false, "item_separator": ", ", "key_separator": ": "}),
        );
    }
    schema
}

/// A compiled grammar in its start state; cheap to clone.
#[derive(Clone)]
pub struct Constraint(Arc<Compiled>);

struct Compiled {
    key: [u8; 32],
    /// Cloned (deeply) for every sample; the lock is held only for the clone.
    start: Mutex<Matcher>,
}

impl fmt::Debug for Constraint {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Constraint({:02x?})", &self.0.key[..6])
    }
}

impl PartialEq for Constraint {
    fn eq(&self, other: &Self) -> bool {
        self.0.key == other.0.key
    }
}

impl Constraint {
    /// A matcher of its own for one sample.
    pub fn matcher(&self) -> GrammarMatcher {
        let start = self.0.start.lock().unwrap_or_else(|p| p.into_inner());
        GrammarMatcher {
            m: start.deep_clone(),
            ready: None,
        }
    }
}

/// One sample's position in its grammar.
pub struct GrammarMatcher {
    m: Matcher,
    /// The mask of the current position, computed ahead ([`Self::prepare`]).
    ready: Option<SimpleVob>,
}

impl fmt::Debug for GrammarMatcher {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "GrammarMatcher(stopped: {})", self.m.is_stopped())
    }
}

impl GrammarMatcher {
    /// Set every logit the grammar forbids next to -inf (ids past the
    /// vocabulary too). Fails when the parser is in error or allows nothing.
    pub fn mask(&mut self, logits: &mut [f32]) -> Result<(), EngineError> {
        let mask = match self.ready.take() {
            Some(mask) => mask,
            None => self.m.compute_mask().map_err(grammar_error)?,
        };
        if mask.is_zero() {
            return Err(EngineError::Grammar(GrammarFault::NoNextToken));
        }
        let words = mask.as_slice();
        for (w, chunk) in logits.chunks_mut(32).enumerate() {
            let bits = words.get(w).copied().unwrap_or(0);
            if bits == u32::MAX {
                continue;
            }
            for (b, x) in chunk.iter_mut().enumerate() {
                if bits & (1 << b) == 0 {
                    *x = f32::NEG_INFINITY;
                }
            }
        }
        Ok(())
    }

    /// Compute the mask of the current position now, for the next
    /// [`mask`](Self::mask) (the scheduler does this while the forward
    /// pass runs). An error is kept for `mask` to report.
    pub fn prepare(&mut self) {
        if self.ready.is_none() {
            self.ready = self.m.compute_mask().ok();
        }
    }

    /// How many leading `tokens` the grammar accepts from here, without
    /// advancing (a speculative draft is cut there: the rest could never
    /// be sampled).
    pub fn valid_prefix(&mut self, tokens: &[u32]) -> usize {
        let vocab = self.m.tok_env().map_or(0, |e| e.tok_trie().vocab_size());
        let end = tokens
            .iter()
            .position(|&t| t as usize >= vocab)
            .unwrap_or(tokens.len());
        self.m.validate_tokens(&tokens[..end]).unwrap_or(0)
    }

    /// Advance past `token` (a token the mask allowed).
    pub fn advance(&mut self, token: u32) -> Result<(), EngineError> {
        self.ready = None;
        self.m.consume_token(token).map_err(grammar_error)
    }

    /// The grammar is complete and allows nothing more.
    pub fn is_stopped(&self) -> bool {
        self.m.is_stopped()
    }

    /// Whether the grammar may end here (the mask allows the stop ids).
    pub fn is_accepting(&mut self) -> bool {
        self.m.is_accepting().unwrap_or(false)
    }
}

/// llguidance's error (its `anyhow` errors, its parser's message) as the
/// source of a grammar error.
fn grammar_error(e: impl Into<LibraryError>) -> EngineError {
    EngineError::Grammar(GrammarFault::Parser(e.into()))
}

/// The engine's grammar compiler: the vocabulary trie and llguidance's
/// parser factory (built on first use), and the compiled-grammar cache.
pub struct Grammars {
    tokenizer: Arc<Tokenizer>,
    stop: Vec<u32>,
    factory: OnceLock<Result<ParserFactory, Arc<dyn std::error::Error + Send + Sync>>>,
    cache: Mutex<HashMap<[u8; 32], Constraint>>,
}

impl fmt::Debug for Grammars {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Grammars")
            .field("built", &self.factory.get().is_some())
            .finish()
    }
}

impl Grammars {
    /// Grammars over `tokenizer`'s vocabulary; `stop` end a generation.
    pub fn new(tokenizer: Arc<Tokenizer>, stop: Vec<u32>) -> Grammars {
        Grammars {
            tokenizer,
            stop,
            factory: OnceLock::new(),
            cache: Mutex::new(HashMap::new()),
        }
    }

    fn factory(&self) -> Result<&ParserFactory, EngineError> {
        let built = self.factory.get_or_init(|| {
            let env = vocab::tok_env(self.tokenizer.clone(), &self.stop);
            let mut f =
                ParserFactory::new_simple(&env).map_err(|e| Arc::from(LibraryError::from(e)))?;
            f.quiet();
            Ok(f)
        });
        built
            .as_ref()
            .map_err(|e| EngineError::Grammar(GrammarFault::TokenTrie(e.clone())))
    }

    /// Compile `spec` (or take it from the cache). The error's reason is
    /// llguidance's (an unknown type, a bad `$ref`, a Lark syntax error).
    pub fn compile(&self, spec: &GrammarSpec) -> Result<Constraint, EngineError> {
        let key = spec.key();
        if let Some(c) = self.lock().get(&key) {
            return Ok(c.clone());
        }
        let grammar = match spec {
            GrammarSpec::JsonSchema(v) => TopLevelGrammar::from_json_schema(v.clone()),
            GrammarSpec::Lark(s) => TopLevelGrammar::from_lark(s.clone()),
        };
        let parser = self
            .factory()?
            .create_parser(grammar)
            .map_err(grammar_error)?;
        let start = Matcher::new(Ok(parser));
        if let Some(e) = start.get_error() {
            return Err(grammar_error(e));
        }
        let c = Constraint(Arc::new(Compiled {
            key,
            start: Mutex::new(start),
        }));
        let mut cache = self.lock();
        if cache.len() >= CACHE_ENTRIES {
            cache.clear();
        }
        cache.insert(key, c.clone());
        Ok(c)
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<[u8; 32], Constraint>> {
        self.cache.lock().unwrap_or_else(|p| p.into_inner())
    }
}

#[cfg(test)]
mod tests;
