//! Rendezvous (highest-random-weight) hashing: which live node owns a key.
//!
//! Every node computes the same owner from the same membership view, with no
//! coordination: `owner(key) = argmax_node blake3(node_id || key)`. When a node
//! joins or leaves, only the keys it wins or held move (about 1/N of them),
//! which is what keeps re-announcing cheap. Deterministic across processes:
//! blake3, never a seeded std hasher.

use kvfabric_store::keys::BlockKey;

/// Weight of `node_id` for `key`; the highest weight owns the key.
pub fn weight(node_id: &str, key: &BlockKey) -> u64 {
    let mut h = blake3::Hasher::new();
    h.update(&(node_id.len() as u32).to_le_bytes());
    h.update(node_id.as_bytes());
    h.update(key.as_bytes());
    let out = h.finalize();
    let mut w = [0u8; 8];
    w.copy_from_slice(&out.as_bytes()[..8]);
    u64::from_le_bytes(w)
}

/// The owner of `key` among `nodes` (ties broken by the smaller id); None when empty.
pub fn owner<'a, I>(nodes: I, key: &BlockKey) -> Option<&'a str>
where
    I: IntoIterator<Item = &'a str>,
{
    nodes
        .into_iter()
        .map(|n| (weight(n, key), n))
        .max_by(|a, b| a.0.cmp(&b.0).then_with(|| b.1.cmp(a.1)))
        .map(|(_, n)| n)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(i: u32) -> BlockKey {
        BlockKey(*blake3::hash(&i.to_le_bytes()).as_bytes())
    }

    #[test]
    fn owners_are_balanced_and_move_minimally() {
        let three = ["a", "b", "c"];
        let four = ["a", "b", "c", "d"];
        let mut counts = [0usize; 3];
        let mut moved = 0;
        for i in 0..3000 {
            let k = key(i);
            let o3 = owner(three.iter().copied(), &k).unwrap();
            counts[three.iter().position(|n| *n == o3).unwrap()] += 1;
            let o4 = owner(four.iter().copied(), &k).unwrap();
            if o3 != o4 {
                assert_eq!(o4, "d", "a key only moves to the new node");
                moved += 1;
            }
        }
        for c in counts {
            assert!((800..1200).contains(&c), "unbalanced: {counts:?}");
        }
        assert!((500..1000).contains(&moved), "moved {moved} of 3000");
    }

    #[test]
    fn owner_is_order_independent_and_none_when_empty() {
        let k = key(7);
        assert_eq!(owner(["x", "y", "z"], &k), owner(["z", "x", "y"], &k));
        assert_eq!(owner(std::iter::empty::<&str>(), &k), None);
    }
}
