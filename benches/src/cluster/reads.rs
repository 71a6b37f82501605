//! The remote reads `kvfabric bench cluster` times, and the plain transfer
//! READs it compares them with: blocks held by node A, read by node C into
//! slots of one registered destination region.

use std::sync::Arc;

use anyhow::anyhow;
use kvfabric_node::cluster::{ClusterNode, ReadTarget};
use kvfabric_store::{BlockKey, KeyChain, ModelFingerprint, PutOptions};
use kvfabric_transfer::{SegmentId, SharedRegion, TransferOp};

use super::args::{layout, ClusterArgs};

/// The blocks, the destination and the peers of the timed reads.
pub(super) struct Reads {
    c: Arc<ClusterNode>,
    pub(super) keys: Vec<BlockKey>,
    /// Where each key's block lies in A's RAM arena.
    offsets: Vec<u64>,
    dest: Arc<SharedRegion>,
    seg: SegmentId,
    /// Free destination slots (one per read in flight).
    slots: tokio::sync::Mutex<Vec<usize>>,
    remote_seg: SegmentId,
    peer: String,
    pub(super) batch: usize,
    pub(super) block_bytes: usize,
}

impl Reads {
    /// Store `args.blocks` blocks on `a` and set up C's destination.
    pub(super) async fn prepare(
        args: &ClusterArgs,
        a: Arc<ClusterNode>,
        c: Arc<ClusterNode>,
    ) -> anyhow::Result<Reads> {
        let big = layout(args.block_bytes);
        let block_bytes = big.block_bytes();
        let bchain = KeyChain::new(
            b"bench-get",
            &ModelFingerprint::new(&[2; 32], "llama"),
            &big,
        );
        let btokens: Vec<u32> = (0..(args.blocks * 64) as u32).collect();
        let keys = bchain.keys(&btokens);
        let mut data = vec![0u8; block_bytes];
        for (i, k) in keys.iter().enumerate() {
            data.iter_mut()
                .enumerate()
                .for_each(|(j, b)| *b = (i * 31 + j) as u8);
            a.store().put(*k, big, &data, PutOptions::default())?;
        }
        a.sync().await;
        let batch = args.batch.clamp(1, keys.len());
        let concurrency = args.concurrency.max(1);
        // Destination: a region registered with C's engine, one slot per block in
        // flight (the same destination the tcp baselines read into).
        let slots_n = concurrency * batch;
        let dest = Arc::new(SharedRegion::create("bench-dest", block_bytes * slots_n)?);
        let seg = c.transfer().register(dest.clone());
        let mut offsets = Vec::new();
        for k in &keys {
            let off = a
                .store()
                .lease(k)?
                .map(|l| l.region_offset())
                .ok_or_else(|| anyhow!("block vanished from A"))?;
            offsets.push(off);
        }
        Ok(Reads {
            slots: tokio::sync::Mutex::new((0..concurrency).collect()),
            remote_seg: a.ram_segment(),
            peer: a.info().transfer_addr.clone(),
            c,
            keys,
            offsets,
            dest,
            seg,
            batch,
            block_bytes,
        })
    }

    fn slot_target(&self, slot: usize) -> ReadTarget<'_> {
        ReadTarget {
            region: &self.dest,
            segment: self.seg,
            offset: (slot * self.block_bytes) as u64,
            capacity: self.block_bytes as u64,
        }
    }

    /// Warm-up and check: every block once through the batched path,
    /// compared byte for byte with what A stored, and once through the
    /// single-block path.
    pub(super) async fn check(&self) -> anyhow::Result<()> {
        let (c, keys, batch, block_bytes, dest) = (
            &self.c,
            &self.keys,
            self.batch,
            self.block_bytes,
            &self.dest,
        );
        for (n, chunk) in keys.chunks(batch).enumerate() {
            let targets: Vec<ReadTarget<'_>> =
                (0..chunk.len()).map(|s| self.slot_target(s)).collect();
            let got = c.read_verified(chunk, &[], &targets).await;
            anyhow::ensure!(
                got == chunk.len(),
                "batched read got {got} of {}",
                chunk.len()
            );
            for (j, t) in targets.iter().enumerate() {
                // SAFETY: the read into the slot has completed; nothing else uses it now.
                let bytes = unsafe { dest.slice(t.offset as usize, block_bytes) }?;
                let i = n * batch + j;
                anyhow::ensure!(
                    bytes
                        .iter()
                        .enumerate()
                        .all(|(x, b)| *b == (i * 31 + x) as u8),
                    "block {i} read from A differs from what A stored"
                );
            }
        }
        for k in keys {
            let b = c
                .get(k)
                .await?
                .ok_or_else(|| anyhow!("block {k:?} not found from C"))?;
            anyhow::ensure!(
                b.node_id == "a" && b.data.len() == block_bytes,
                "unexpected read: {} {}",
                b.node_id,
                b.data.len()
            );
        }
        Ok(())
    }

    /// Batch `b` of `batch` keys through C's batched remote get; bytes read.
    pub(super) async fn remote_batched(&self, b: usize) -> anyhow::Result<u64> {
        let (batch, block_bytes, keys) = (self.batch, self.block_bytes, &self.keys);
        let chunk = &keys[b * batch..((b + 1) * batch).min(keys.len())];
        let slot = self.take_slot().await?;
        let targets: Vec<ReadTarget<'_>> = (0..chunk.len())
            .map(|j| self.slot_target(slot * batch + j))
            .collect();
        let got = self.c.read_verified(chunk, &[], &targets).await;
        self.slots.lock().await.push(slot);
        anyhow::ensure!(
            got == chunk.len(),
            "batched remote get read {got} of {}",
            chunk.len()
        );
        Ok((got * block_bytes) as u64)
    }

    /// Key `i` through C's single-block remote get; bytes read.
    pub(super) async fn remote_single(&self, i: usize) -> anyhow::Result<u64> {
        let slot = self.take_slot().await?;
        // Same destination footprint as the batched runs.
        let target = self.slot_target(slot * self.batch + i % self.batch);
        let r = self.c.get_into(&self.keys[i], None, &target).await;
        self.slots.lock().await.push(slot);
        match r {
            Ok(Some((b, len))) if b.node_id == "a" => Ok(len),
            Ok(Some((b, _))) => Err(anyhow!("read served by {} instead of a", b.node_id)),
            Ok(None) => Err(anyhow!("remote get missed")),
            Err(e) => Err(e.into()),
        }
    }

    /// Plain transfer READs of batch `b` of `per` blocks of A's RAM arena,
    /// same engines, into the same destination slots; bytes moved.
    pub(super) async fn tcp(&self, per: usize, b: usize) -> anyhow::Result<u64> {
        let (batch, block_bytes) = (self.batch, self.block_bytes);
        let chunk = &self.offsets[b * per..((b + 1) * per).min(self.offsets.len())];
        let slot = self.take_slot().await?;
        let ops = chunk
            .iter()
            .enumerate()
            .map(|(j, off)| {
                TransferOp::read(
                    self.seg,
                    ((slot * batch + (b * per + j) % batch) * block_bytes) as u64,
                    self.remote_seg,
                    *off,
                    block_bytes as u64,
                )
            })
            .collect();
        let r = self.c.transfer().batch(&self.peer, ops).await;
        self.slots.lock().await.push(slot);
        let mut moved = 0;
        for r in r {
            r.map_err(|e| anyhow!("transfer: {e}"))?;
            moved += block_bytes as u64;
        }
        Ok(moved)
    }

    async fn take_slot(&self) -> anyhow::Result<usize> {
        self.slots
            .lock()
            .await
            .pop()
            .ok_or_else(|| anyhow!("no slot"))
    }
}
