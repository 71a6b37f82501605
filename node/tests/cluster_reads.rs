//! Batched cluster reads on an in-process cluster (loopback, tcp transport):
//! `lease_many` across holders, `read_leased` of sub-ranges, bounds checks,
//! holders that die or stall mid-read, whole verified blocks through
//! `lease_many` + `read_leased` (the kit's `read_verified`), and the
//! single-block `get` / `get_into` (optionally hinted) built on them.

use std::sync::Arc;
use std::time::{Duration, Instant};

use kvfabric_node::cluster::{
    ClusterNode, HolderEntry, HolderTier, LeasedBlock, RangeRead, ReadTarget,
};
use kvfabric_store::{BlockKey, StoreError};
use kvfabric_testkit::cluster::{data, key, layout, read_verified, Cluster, Options};
use kvfabric_transfer::{SegmentId, SharedRegion};

/// Every test stops itself.
const LIMIT: Duration = Duration::from_secs(60);

fn dest(node: &ClusterNode, bytes: usize) -> (Arc<SharedRegion>, SegmentId) {
    let region = Arc::new(SharedRegion::create("test-dest", bytes).unwrap());
    let seg = node.transfer().register(region.clone());
    (region, seg)
}

/// A read of `len` bytes at `offset` of `block` into `target`.
fn read<'a>(
    block: &'a LeasedBlock,
    offset: u64,
    len: u64,
    target: ReadTarget<'a>,
) -> RangeRead<'a> {
    RangeRead {
        block,
        offset,
        len,
        target,
    }
}

fn bytes_at(region: &SharedRegion, at: u64, len: u64) -> Vec<u8> {
    unsafe { region.slice(at as usize, len as usize) }
        .unwrap()
        .to_vec()
}

fn fill(region: &SharedRegion, byte: u8) {
    unsafe { region.slice_mut(0, region.len()) }
        .unwrap()
        .fill(byte);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lease_many_across_two_holders_and_local() {
    tokio::time::timeout(LIMIT, async {
        let c = Cluster::start(3, Options::default()).await;
        let l = layout(64);
        let local: Vec<BlockKey> = (0..3).map(|i| key(1, i)).collect();
        let at1: Vec<BlockKey> = (0..4).map(|i| key(2, i)).collect();
        let at2: Vec<BlockKey> = (0..5).map(|i| key(3, i)).collect();
        c.put(0, &local, l).await;
        c.put(1, &at1, l).await;
        c.put(2, &at2, l).await;
        let missing = key(9, 0);
        let mut keys = vec![missing];
        keys.extend(at1.iter().chain(&local).chain(&at2));
        let before = [
            c.nodes[1].holder_lease_counts(),
            c.nodes[2].holder_lease_counts(),
        ];
        let leased = c.nodes[0].lease_many(&keys, &vec![None; keys.len()]).await;
        assert!(leased[0].is_none(), "a key held nowhere is None");
        for (k, b) in keys.iter().zip(&leased).skip(1) {
            let b = b.as_ref().unwrap_or_else(|| panic!("{k:?} not leased"));
            let want = if local.contains(k) {
                "n0"
            } else if at1.contains(k) {
                "n1"
            } else {
                "n2"
            };
            assert_eq!(b.holder(), want);
            assert_eq!(b.key(), k);
            assert_eq!(b.is_local(), want == "n0");
            assert_eq!(b.len(), l.block_bytes() as u64);
            assert_eq!(b.layout(), &l);
            let sum = kvfabric_transfer::checksum::checksum(&data(k, l.block_bytes()));
            assert_eq!(b.checksum(), sum);
        }
        // ONE lease RPC per holder, carrying all of its keys.
        let after = [
            c.nodes[1].holder_lease_counts(),
            c.nodes[2].holder_lease_counts(),
        ];
        assert_eq!((after[0].0 - before[0].0, after[0].1 - before[0].1), (1, 4));
        assert_eq!((after[1].0 - before[1].0, after[1].1 - before[1].1), (1, 5));
        assert_eq!(c.nodes[1].remote_leases_held(), 4);
        // Dropping the blocks releases the remote leases (in the background).
        drop(leased);
        let deadline = Instant::now() + Duration::from_secs(5);
        while c.nodes[1].remote_leases_held() + c.nodes[2].remote_leases_held() > 0 {
            assert!(Instant::now() < deadline, "remote leases were not released");
            tokio::time::sleep(Duration::from_millis(10)).await;
        }

        // Hints from a lookup: used as given. A wrong hint (n2 for a block of
        // n1) still ends at the right holder through the owner's entry.
        let hints = c.nodes[0].lookup(&at1).await;
        assert_eq!(hints.len(), at1.len());
        let mut hints: Vec<Option<HolderEntry>> = hints.into_iter().map(Some).collect();
        hints[0] = Some(HolderEntry {
            node_id: "n2".into(),
            tier: HolderTier::Ram,
            size: l.block_bytes() as u64,
            checksum: 0,
        });
        let leased = c.nodes[0].lease_many(&at1, &hints).await;
        assert!(leased
            .iter()
            .all(|b| b.as_ref().is_some_and(|b| b.holder() == "n1")));
    })
    .await
    .expect("test timed out");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn read_leased_sub_ranges_land_the_right_bytes() {
    tokio::time::timeout(LIMIT, async {
        let c = Cluster::start(2, Options::default()).await;
        let l = layout(64);
        let (r1, r2, here) = (key(4, 1), key(4, 2), key(4, 3));
        c.put(1, &[r1, r2], l).await;
        c.put(0, &[here], l).await;
        let leased = c.nodes[0]
            .lease_many(&[r1, r2, here], &[None, None, None])
            .await;
        let [Some(b1), Some(b2), Some(bh)] = &leased[..] else {
            panic!("not all leased: {leased:?}");
        };
        assert!(!b1.is_local() && bh.is_local());
        let (region, seg) = dest(&c.nodes[0], 1 << 20);
        fill(&region, 0);
        let target = |offset: u64, capacity: u64| ReadTarget {
            region: &region,
            segment: seg,
            offset,
            capacity,
        };
        let layer1 = l.layer_range(1);
        let ranges = [
            (b1, 0u64, 1000u64, 0u64),
            (b1, layer1.start as u64, layer1.len() as u64, 8192),
            (b2, 100, 200, 100_000),
            (bh, 5, 5000, 200_000),
            (bh, 0, bh.len(), 300_000),
        ];
        let reads: Vec<RangeRead<'_>> = ranges
            .iter()
            .map(|&(b, offset, len, at)| RangeRead {
                block: b,
                offset,
                len,
                target: target(at, len),
            })
            .collect();
        let results = c.nodes[0].read_leased(&reads).await;
        for ((b, offset, len, at), r) in ranges.iter().zip(&results) {
            assert!(r.is_ok(), "{r:?}");
            let whole = data(b.key(), b.len() as usize);
            assert_eq!(
                bytes_at(&region, *at, *len),
                whole[*offset as usize..(*offset + *len) as usize],
                "range {offset}+{len} of {:?}",
                b.key()
            );
        }
        // Bytes outside the targets were not touched.
        assert!(bytes_at(&region, 1000, 1000).iter().all(|&x| x == 0));
    })
    .await
    .expect("test timed out");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn out_of_range_reads_are_refused_and_move_nothing() {
    tokio::time::timeout(LIMIT, async {
        let c = Cluster::start(
            2,
            Options {
                proxied: vec![1],
                ..Options::default()
            },
        )
        .await;
        let l = layout(64);
        let (k, here) = (key(5, 1), key(5, 2));
        c.put(1, &[k], l).await;
        c.put(0, &[here], l).await;
        let leased = c.nodes[0].lease_many(&[k, here], &[None, None]).await;
        let [Some(b), Some(bh)] = &leased[..] else {
            panic!("not leased: {leased:?}");
        };
        let (region, seg) = dest(&c.nodes[0], 256 << 10);
        fill(&region, 0xab);
        let target = |offset: u64, capacity: u64| ReadTarget {
            region: &region,
            segment: seg,
            offset,
            capacity,
        };
        let len = b.len();
        let refused = [
            // Past the block's end.
            read(b, len - 10, 20, target(0, 20)),
            // Offset + len overflows.
            read(b, u64::MAX - 5, 10, target(0, 10)),
            // Larger than the target's capacity.
            read(b, 0, 4096, target(0, 4095)),
            // Past the end of the target region.
            read(b, 0, 4096, target(region.len() as u64 - 100, 4096)),
            // A local block past its end.
            read(bh, 1, bh.len(), target(0, bh.len())),
        ];
        let proxied = c.proxies[1].as_ref().unwrap();
        let moved_before = proxied.back_bytes();
        let results = c.nodes[0].read_leased(&refused).await;
        for r in &results {
            match r {
                Err(kvfabric_node::NodeError::Store(StoreError::InvalidArgument(m))) => {
                    let m = m.to_string();
                    assert!(m.contains("outside") || m.contains("do not fit"), "{m}")
                }
                other => panic!("expected a refusal, got {other:?}"),
            }
        }
        assert_eq!(
            proxied.back_bytes(),
            moved_before,
            "a refused op moved bytes"
        );
        assert!(bytes_at(&region, 0, region.len() as u64)
            .iter()
            .all(|&x| x == 0xab));
        // A good op beside a refused one still runs.
        let mixed = [
            read(b, 0, 100, target(0, 100)),
            read(b, len, 1, target(200, 1)),
        ];
        let results = c.nodes[0].read_leased(&mixed).await;
        assert!(results[0].is_ok() && results[1].is_err(), "{results:?}");
        assert_eq!(bytes_at(&region, 0, 100), data(&k, len as usize)[..100]);
        assert_eq!(bytes_at(&region, 200, 1), [0xab]);
    })
    .await
    .expect("test timed out");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_holder_dying_or_stalling_mid_read_yields_errors_within_the_timeout() {
    tokio::time::timeout(LIMIT, async {
        let read_timeout = Duration::from_millis(1500);
        let c = Cluster::start(
            2,
            Options {
                proxied: vec![1],
                remote_read_timeout_ms: read_timeout.as_millis() as u64,
                ..Options::default()
            },
        )
        .await;
        let l = layout(3072); // 1.5 MiB blocks
        let keys: Vec<BlockKey> = (0..8).map(|i| key(6, i)).collect();
        c.put(1, &keys, l).await;
        let block = l.block_bytes() as u64;
        let (region, seg) = dest(&c.nodes[0], (block * 8) as usize);
        let targets: Vec<ReadTarget<'_>> = (0..8)
            .map(|i| ReadTarget {
                region: &region,
                segment: seg,
                offset: i * block,
                capacity: block,
            })
            .collect();
        let proxy = c.proxies[1].as_ref().unwrap();

        // Dies after 2 MiB of the 12 MiB came back.
        let leased = c.nodes[0].lease_many(&keys, &vec![None; 8]).await;
        assert!(leased.iter().all(|b| b.is_some()));
        let reads: Vec<RangeRead<'_>> = leased
            .iter()
            .flatten()
            .zip(&targets)
            .map(|(b, t)| RangeRead {
                block: b,
                offset: 0,
                len: b.len(),
                target: *t,
            })
            .collect();
        proxy.cut_after(2 << 20);
        let started = Instant::now();
        let results = c.nodes[0].read_leased(&reads).await;
        let took = started.elapsed();
        let failed = results.iter().filter(|r| r.is_err()).count();
        assert!(failed >= 6, "only {failed} of 8 reads failed: {results:?}");
        assert!(
            took < read_timeout + Duration::from_secs(2),
            "the failed read took {took:?}"
        );
        // A verified batch read on the dead holder: no hang, nothing read.
        let started = Instant::now();
        assert_eq!(read_verified(&c.nodes[0], &keys, &[], &targets).await, 0);
        assert!(started.elapsed() < read_timeout * 2 + Duration::from_secs(2));
    })
    .await
    .expect("test timed out");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_holder_stalling_mid_read_fails_its_reads_at_the_timeout() {
    tokio::time::timeout(LIMIT, async {
        let read_timeout = Duration::from_millis(1500);
        let c = Cluster::start(
            2,
            Options {
                proxied: vec![1],
                remote_read_timeout_ms: read_timeout.as_millis() as u64,
                ..Options::default()
            },
        )
        .await;
        let l = layout(3072);
        let keys: Vec<BlockKey> = (0..4).map(|i| key(7, i)).collect();
        c.put(1, &keys, l).await;
        let block = l.block_bytes() as u64;
        let (region, seg) = dest(&c.nodes[0], (block * 4) as usize);
        let leased = c.nodes[0].lease_many(&keys, &vec![None; 4]).await;
        let reads: Vec<RangeRead<'_>> = leased
            .iter()
            .flatten()
            .enumerate()
            .map(|(i, b)| RangeRead {
                block: b,
                offset: 0,
                len: b.len(),
                target: ReadTarget {
                    region: &region,
                    segment: seg,
                    offset: i as u64 * block,
                    capacity: block,
                },
            })
            .collect();
        assert_eq!(reads.len(), 4);
        c.proxies[1].as_ref().unwrap().freeze();
        let started = Instant::now();
        let results = c.nodes[0].read_leased(&reads).await;
        let took = started.elapsed();
        assert!(results.iter().all(|r| r.is_err()), "{results:?}");
        assert!(
            took < read_timeout + Duration::from_secs(2),
            "the stalled read took {took:?}"
        );
    })
    .await
    .expect("test timed out");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_verified_batch_read_stops_at_a_corrupt_block_and_reports_it() {
    tokio::time::timeout(LIMIT, async {
        let c = Cluster::start(2, Options::default()).await;
        let l = layout(64);
        let keys: Vec<BlockKey> = (0..5).map(|i| key(8, i)).collect();
        c.put(1, &keys, l).await;
        // Flip one byte of block 2 in n1's RAM arena (its stored checksum stays).
        {
            let lease = c.nodes[1].store().lease(&keys[2]).unwrap().unwrap();
            let at = lease.region_offset() as usize + 77;
            let b = unsafe { c.nodes[1].store().region().slice_mut(at, 1) }.unwrap();
            b[0] ^= 0x5a;
        }
        let block = l.block_bytes() as u64;
        let (region, seg) = dest(&c.nodes[0], (block * 5) as usize);
        let targets: Vec<ReadTarget<'_>> = (0..5)
            .map(|i| ReadTarget {
                region: &region,
                segment: seg,
                offset: i * block,
                capacity: block,
            })
            .collect();
        let hints: Vec<Option<HolderEntry>> = c.nodes[0]
            .lookup(&keys)
            .await
            .into_iter()
            .map(Some)
            .collect();
        assert_eq!(hints.len(), 5);
        assert_eq!(read_verified(&c.nodes[0], &keys, &hints, &targets).await, 2);
        for (i, k) in keys.iter().take(2).enumerate() {
            assert_eq!(
                bytes_at(&region, i as u64 * block, block),
                data(k, block as usize)
            );
        }
        // The corrupt holder was reported stale: the owner no longer lists it.
        let located = c.nodes[0].locate(&keys[2..4]).await;
        assert!(located[0].is_empty(), "still listed: {:?}", located[0]);
        assert_eq!(located[1].len(), 1);

        // Past the first verification wave: a corrupt 7th block of 9.
        let more: Vec<BlockKey> = (0..9).map(|i| key(11, i)).collect();
        c.put(1, &more, l).await;
        {
            let lease = c.nodes[1].store().lease(&more[6]).unwrap().unwrap();
            let at = lease.region_offset() as usize + 5;
            let b = unsafe { c.nodes[1].store().region().slice_mut(at, 1) }.unwrap();
            b[0] ^= 0x01;
        }
        let (big, big_seg) = dest(&c.nodes[0], (block * 9) as usize);
        let wide: Vec<ReadTarget<'_>> = (0..9)
            .map(|i| ReadTarget {
                region: &big,
                segment: big_seg,
                offset: i * block,
                capacity: block,
            })
            .collect();
        assert_eq!(read_verified(&c.nodes[0], &more, &[], &wide).await, 6);
        assert_eq!(
            bytes_at(&big, 5 * block, block),
            data(&more[5], block as usize)
        );

        // A miss ends the batch too.
        let with_gap = [keys[0], key(8, 99), keys[1]];
        assert_eq!(
            read_verified(&c.nodes[0], &with_gap, &[], &targets).await,
            1
        );
        // Targets too small for the block: nothing counts as read.
        let small = [ReadTarget {
            capacity: block - 1,
            ..targets[0]
        }];
        assert_eq!(read_verified(&c.nodes[0], &keys[..1], &[], &small).await, 0);
    })
    .await
    .expect("test timed out");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn single_block_gets_still_work_on_the_batched_path() {
    tokio::time::timeout(LIMIT, async {
        let c = Cluster::start(3, Options::default()).await;
        let l = layout(64);
        let (remote, here) = (key(10, 1), key(10, 2));
        c.put(1, &[remote], l).await;
        c.put(0, &[here], l).await;
        let n0 = &c.nodes[0];
        let len = l.block_bytes();
        let got = n0.get(&remote).await.unwrap().expect("remote get");
        assert_eq!((got.node_id.as_str(), got.data), ("n1", data(&remote, len)));
        let got = n0.get(&here).await.unwrap().expect("local get");
        assert_eq!((got.node_id.as_str(), got.data), ("n0", data(&here, len)));
        assert!(n0.get(&key(10, 3)).await.unwrap().is_none());

        let (region, seg) = dest(n0, 2 * len);
        let t = ReadTarget {
            region: &region,
            segment: seg,
            offset: len as u64,
            capacity: len as u64,
        };
        let (facts, n) = n0
            .get_into(&remote, None, &t)
            .await
            .unwrap()
            .expect("get_into");
        assert_eq!((facts.node_id.as_str(), n), ("n1", len as u64));
        assert_eq!(
            bytes_at(&region, len as u64, len as u64),
            data(&remote, len)
        );
        // A hint naming a node without the block: the owner's entry still serves it.
        fill(&region, 0);
        let wrong = HolderEntry {
            node_id: "n2".into(),
            tier: HolderTier::Ram,
            size: len as u64,
            checksum: 0,
        };
        let (facts, _) = n0
            .get_into(&remote, Some(&wrong), &t)
            .await
            .unwrap()
            .expect("get_into hinted");
        assert_eq!(facts.node_id, "n1");
        assert_eq!(
            bytes_at(&region, len as u64, len as u64),
            data(&remote, len)
        );
        // A target too small is the caller's error, not a miss.
        let small = ReadTarget {
            capacity: len as u64 - 1,
            ..t
        };
        assert!(matches!(
            n0.get_into(&remote, None, &small).await,
            Err(kvfabric_node::NodeError::Store(
                StoreError::InvalidArgument(_)
            ))
        ));
    })
    .await
    .expect("test timed out");
}
