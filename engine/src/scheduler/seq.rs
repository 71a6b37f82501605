//! A sequence as the scheduler holds it ([`Seq`]: tokens, block table,
//! sampler, fabric and drafting state) and a sequence waiting on the fabric
//! ([`Loading`], [`FabricWait`]). The scheduler's files all work on these.

use kvfabric_connector::PendingLookup;
use kvfabric_types::{BlockKey, KeyChain};
use tokio::sync::mpsc;

use super::fabric_state::{FabricState, LoadBlocks, Streaming};
use crate::kv::BlockTable;
use crate::request::{FinishReason, Fork, GenerationEvent, Usage};
use crate::sampling::Sampler;
use crate::spec::SpecState;

/// One request's sequence.
pub(super) struct Seq {
    /// Unique per scheduler; tags this sequence's saves.
    pub(super) id: u64,
    pub(super) events: mpsc::Sender<GenerationEvent>,
    /// Prompt then generated tokens.
    pub(super) tokens: Vec<u32>,
    pub(super) prompt_len: usize,
    /// Tokens whose KV is in `table`.
    pub(super) computed: usize,
    pub(super) table: BlockTable,
    /// Leading blocks registered in the prefix cache; `parent` is the last one's key.
    pub(super) registered: usize,
    pub(super) parent: Option<BlockKey>,
    pub(super) chain: KeyChain,
    pub(super) sampler: Sampler,
    pub(super) max_tokens: usize,
    pub(super) generated: usize,
    pub(super) stop: Vec<u32>,
    pub(super) return_logits: bool,
    pub(super) cached_tokens: Option<usize>,
    /// Fabric state of each registered block (empty without a connector).
    pub(super) fabric: Vec<FabricState>,
    /// Prefill role: how the request ended, sent once its saves are done.
    pub(super) finished: Option<(FinishReason, Usage)>,
    /// A load still streaming into this sequence's table.
    pub(super) stream: Option<Streaming>,
    /// More samples to start from this prompt's logits (`n`; see `fork.rs`).
    pub(super) forks: Vec<Fork>,
    /// Drafting state (speculative decoding).
    pub(super) spec: SpecState,
    /// Draft tokens at the end of `tokens`, planned for verification this step.
    pub(super) drafted: usize,
    /// A batch-job request (runs below interactive ones; see `priority.rs`).
    pub(super) batch: bool,
    /// Who its saved blocks count to in the fabric's tier shares.
    pub(super) owner: Option<std::sync::Arc<str>>,
}

impl Seq {
    /// Give back every block (the cache keeps what was registered) and
    /// start over from no KV; a load still streaming in keeps its blocks
    /// until it ends.
    pub(super) fn drop_kv(&mut self) {
        self.stream = None;
        self.table.clear();
        self.computed = 0;
        self.registered = 0;
        self.parent = None;
        self.fabric.clear();
    }
}

/// A sequence waiting on the fabric, first for its lookup, then for the
/// blocks being loaded into its pool blocks.
pub(super) struct Loading {
    pub(super) seq: Seq,
    pub(super) stage: FabricWait,
}

/// What a [`Loading`] sequence waits for; `keys` are the blocks after its
/// local prefix.
pub(super) enum FabricWait {
    Lookup {
        pending: PendingLookup,
        keys: Vec<BlockKey>,
    },
    Load {
        load: LoadBlocks,
        keys: Vec<BlockKey>,
        /// May still run layer by layer (false once a stream let it down).
        streamable: bool,
    },
}
