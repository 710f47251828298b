//! The prefix cache's index: which blocks of a KV pool hold which prompt prefixes, kept after
//! the sessions that computed them end, so the next prompt that starts with the same tokens
//! takes them instead of computing them again.
//!
//! A radix tree at block granularity: each node is one full block of the pool, keyed by the
//! exact [`crate::kernel::TILE`] tokens it holds under its parent (the block before it in the
//! sequence; a root holds positions `0..TILE`). Exact keys rather than chained hashes (vLLM's
//! way): a match is the same tokens at the same positions after the same prefix, so the keys and
//! values it holds are the bits the session would have computed itself (a row computes the same
//! in any chunk and any company), and no collision can ever hand a session another prompt's
//! cache. The price is a key of `TILE` ids per block, small beside the block's own kilobytes.
//!
//! Sessions hold the nodes they use (a reference count); a node no session holds stays cached
//! until the pool needs its block, then the least recently used childless one goes first. A
//! session's held nodes are always a path from a root, so a node's ancestors outlive it.
//!
//! A prompt rarely ends on a block boundary, so a match in whole blocks alone would leave up to
//! a block of every repeated prompt to compute again. Two things close that gap, the way a
//! llama-server slot keeps its whole history. A lookup also reports the cached block (full, or a
//! finished session's last partial one, kept as a leaf keyed by the fewer tokens it holds) that
//! shares the most leading tokens with what follows the whole-block match; the pool copies those
//! positions into a block of the session's own, which it then fills past them (copy on write:
//! a cached block is never written). A partial leaf never has children: sequences only grow
//! through full blocks.

use std::collections::{BTreeSet, HashMap};

/// What the prefix cache did since its pool was made.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize, schemars::JsonSchema)]
pub struct PrefixStats {
    /// Lookups: a session about to prefill asked for its longest cached prefix.
    pub queries: u64,
    /// Lookups that found at least one block.
    pub hits: u64,
    /// Tokens the lookups asked for (each history less its last token).
    pub queried_tokens: u64,
    /// Tokens found cached, so not computed (whole blocks, and the leading positions copied from
    /// a partly matching block).
    pub reused_tokens: u64,
    /// Cached blocks taken back for other work.
    pub evictions: u64,
    /// Blocks in the cache now, held by a session or not.
    pub cached_blocks: u64,
}

/// A lookup's answer: the whole blocks matched, and a block whose first positions match what
/// follows them (the block and how many).
#[derive(Debug, Default, PartialEq, Eq)]
pub(crate) struct Prefix {
    pub(crate) blocks: Vec<u32>,
    pub(crate) partial: Option<(u32, usize)>,
}

impl Prefix {
    /// Positions it holds.
    pub(crate) fn tokens(&self, tile: usize) -> usize {
        self.blocks.len() * tile + self.partial.map_or(0, |(_, m)| m)
    }
}

struct Node {
    parent: Option<u32>,
    /// The tokens this block holds (the key under its parent): a whole tile, or fewer in a
    /// finished session's last block.
    key: Box<[u32]>,
    children: HashMap<Box<[u32]>, u32>,
    /// Sessions holding it.
    refs: usize,
    /// When it was last taken or given back (the tree's clock).
    used: u64,
}

/// The index, keyed by block id. It never touches the blocks' contents.
#[derive(Default)]
pub(crate) struct PrefixTree {
    nodes: HashMap<u32, Node>,
    roots: HashMap<Box<[u32]>, u32>,
    /// Nodes no session holds and without children, by last use: the eviction order.
    leaves: BTreeSet<(u64, u32)>,
    /// Nodes no session holds: each can be evicted, deepest first.
    idle: usize,
    clock: u64,
    stats: PrefixStats,
}

impl PrefixTree {
    fn tick(&mut self) -> u64 {
        self.clock += 1;
        self.clock
    }

    fn child(&self, parent: Option<u32>, key: &[u32]) -> Option<u32> {
        match parent {
            None => self.roots.get(key).copied(),
            Some(p) => self.nodes.get(&p)?.children.get(key).copied(),
        }
    }

    /// Takes a hold on the node of `block` (no longer evictable).
    fn hold(&mut self, block: u32) {
        let node = self.nodes.get_mut(&block).expect("a cached block");
        if node.refs == 0 {
            self.idle -= 1;
            self.leaves.remove(&(node.used, block));
        }
        node.refs += 1;
    }

    /// The cached prefix of `tokens`: the blocks holding its longest match in whole blocks of
    /// `tile`, and the cached block sharing the most leading tokens with what follows (copied,
    /// never extended); every block returned is now held by the caller (who gives them back with
    /// [`Self::release`]).
    pub(crate) fn lookup(&mut self, tokens: &[u32], tile: usize) -> Prefix {
        let mut found = Prefix::default();
        let mut parent = None;
        for key in tokens.chunks_exact(tile) {
            let Some(block) = self.child(parent, key) else { break };
            self.hold(block);
            found.blocks.push(block);
            parent = Some(block);
        }
        let rest = &tokens[found.blocks.len() * tile..];
        found.partial = self.best_partial(parent, &rest[..rest.len().min(tile)]);
        if let Some((block, _)) = found.partial {
            self.hold(block);
        }
        let now = self.tick();
        for b in found.blocks.iter().chain(found.partial.as_ref().map(|(b, _)| b)) {
            self.nodes.get_mut(b).expect("a cached block").used = now;
        }
        let stats = &mut self.stats;
        stats.queries += 1;
        stats.hits += u64::from(found.tokens(tile) > 0);
        stats.queried_tokens += tokens.len() as u64;
        stats.reused_tokens += found.tokens(tile) as u64;
        found
    }

    /// The child of `parent` whose key starts with the most of `rest` (at least one token), and
    /// how many.
    fn best_partial(&self, parent: Option<u32>, rest: &[u32]) -> Option<(u32, usize)> {
        let children = match parent {
            None => &self.roots,
            Some(p) => &self.nodes.get(&p)?.children,
        };
        let common = |key: &[u32]| key.iter().zip(rest).take_while(|(a, b)| a == b).count();
        // Among equally long matches any block will do: the same tokens after the same prefix
        // hold the same bits. The lowest id makes the choice reproducible.
        children
            .iter()
            .map(|(key, &b)| (common(key), b))
            .filter(|&(m, _)| m > 0)
            .max_by_key(|&(m, b)| (m, std::cmp::Reverse(b)))
            .map(|(m, b)| (b, m))
    }

    /// Caches `block`, just filled with `key` after `parent` (a block the caller holds, `None`
    /// for a sequence's first), held by the caller. When the same tokens after the same parent
    /// are cached already, nothing changes and the cached block is returned, now held by the
    /// caller instead: its contents are the same bits.
    pub(crate) fn insert(&mut self, parent: Option<u32>, key: &[u32], block: u32) -> Result<(), u32> {
        if let Some(existing) = self.child(parent, key) {
            self.hold(existing);
            return Err(existing);
        }
        let key: Box<[u32]> = key.into();
        match parent {
            None => self.roots.insert(key.clone(), block),
            Some(p) => self.nodes.get_mut(&p).expect("a held parent").children.insert(key.clone(), block),
        };
        let used = self.tick();
        self.nodes.insert(block, Node { parent, key, children: HashMap::new(), refs: 1, used });
        self.stats.cached_blocks += 1;
        Ok(())
    }

    /// Caches a finished session's last block, partly filled with `key` (fewer than a tile of
    /// tokens) after `parent`, as a leaf held by the caller; false (nothing changes) when a
    /// cached block there already starts with the same tokens, so this one would add nothing.
    pub(crate) fn insert_partial(&mut self, parent: Option<u32>, key: &[u32], block: u32) -> bool {
        if key.is_empty() || self.best_partial(parent, key).is_some_and(|(_, m)| m == key.len()) {
            return false;
        }
        self.insert(parent, key, block).is_ok()
    }

    /// Gives back a hold on `block`; false when the block is not cached (a session's own).
    pub(crate) fn release(&mut self, block: u32) -> bool {
        let Some(node) = self.nodes.get_mut(&block) else { return false };
        node.refs -= 1;
        if node.refs == 0 {
            self.clock += 1;
            let now = self.clock;
            node.used = now;
            self.idle += 1;
            if node.children.is_empty() {
                self.leaves.insert((now, block));
            }
        }
        true
    }

    /// Blocks that no session holds: what eviction can give back.
    pub(crate) fn idle(&self) -> usize {
        self.idle
    }

    /// Removes the least recently used block that no session holds and that has no children,
    /// and returns it for reuse.
    pub(crate) fn evict(&mut self) -> Option<u32> {
        let (_, block) = self.leaves.pop_first()?;
        let node = self.nodes.remove(&block).expect("a leaf is a node");
        self.idle -= 1;
        self.stats.evictions += 1;
        self.stats.cached_blocks -= 1;
        match node.parent {
            None => {
                self.roots.remove(&node.key);
            }
            Some(p) => {
                let parent = self.nodes.get_mut(&p).expect("a node's parent outlives it");
                parent.children.remove(&node.key);
                if parent.refs == 0 && parent.children.is_empty() {
                    self.leaves.insert((parent.used, p));
                }
            }
        }
        Some(block)
    }

    pub(crate) fn stats(&self) -> PrefixStats {
        self.stats
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const TILE: usize = 2;

    fn whole(blocks: &[u32]) -> Prefix {
        Prefix { blocks: blocks.to_vec(), partial: None }
    }

    #[test]
    fn what_follows_the_whole_blocks_matches_a_cached_blocks_leading_tokens() {
        const TILE: usize = 4;
        let mut tree = PrefixTree::default();
        tree.insert(None, &[1, 2, 3, 4], 10).unwrap();
        tree.insert(Some(10), &[5, 6, 7, 8], 11).unwrap();
        tree.insert(Some(10), &[5, 6, 9, 9], 12).unwrap();
        // [1 2 3 4] whole, then [5 6 7] leads block 11 (one more than block 12 shares).
        let found = tree.lookup(&[1, 2, 3, 4, 5, 6, 7, 0, 0], TILE);
        assert_eq!(found, Prefix { blocks: vec![10], partial: Some((11, 3)) });
        assert_eq!(found.tokens(TILE), 7);
        // A first block matched in part; a prompt that ends inside a cached block.
        assert_eq!(tree.lookup(&[1, 2, 0, 0], TILE), Prefix { blocks: vec![], partial: Some((10, 2)) });
        assert_eq!(tree.lookup(&[1, 2, 3, 4, 5], TILE), Prefix { blocks: vec![10], partial: Some((11, 1)) });
        assert_eq!(tree.lookup(&[7, 7], TILE), whole(&[]));
        let s = tree.stats();
        assert_eq!((s.queries, s.hits, s.reused_tokens), (4, 3, 7 + 2 + 5));
        // The blocks a lookup copies from are held like the whole ones until given back.
        for b in [10, 11, 10, 10, 11] {
            tree.release(b);
        }
        assert_eq!(tree.idle(), 0, "block 10 is still held by the three inserts' caller");
    }

    #[test]
    fn a_finished_sessions_last_block_is_kept_unless_a_cached_block_covers_it() {
        const TILE: usize = 4;
        let mut tree = PrefixTree::default();
        tree.insert(None, &[1, 2, 3, 4], 10).unwrap();
        assert!(tree.insert_partial(Some(10), &[5, 6], 11), "the first session's tail");
        assert!(!tree.insert_partial(Some(10), &[5], 12), "block 11 starts with [5] already");
        assert!(!tree.insert_partial(Some(10), &[5, 6], 12), "nor a copy of block 11");
        assert!(tree.insert_partial(Some(10), &[5, 6, 7], 12), "a longer tail adds a position");
        assert_eq!(tree.lookup(&[1, 2, 3, 4, 5, 6, 7, 8], TILE), Prefix { blocks: vec![10], partial: Some((12, 3)) });
        // A partial leaf is never a parent: a whole block after it is not found through it.
        assert_eq!(tree.child(Some(11), &[5, 6, 7, 8]), None);
        for b in [10, 12, 10, 11, 12] {
            tree.release(b);
        }
        assert_eq!(tree.idle(), 3);
        assert_eq!([tree.evict(), tree.evict(), tree.evict(), tree.evict()], [Some(11), Some(12), Some(10), None]);
    }

    #[test]
    fn a_lookup_finds_the_longest_cached_prefix_in_whole_blocks() {
        let mut tree = PrefixTree::default();
        // A session caches [1 2][3 4][5 6] in blocks 10, 11, 12.
        tree.insert(None, &[1, 2], 10).unwrap();
        tree.insert(Some(10), &[3, 4], 11).unwrap();
        tree.insert(Some(11), &[5, 6], 12).unwrap();
        assert_eq!(tree.lookup(&[1, 2, 3, 4, 9, 9, 7], TILE), whole(&[10, 11]));
        assert_eq!(tree.lookup(&[3, 4], TILE), whole(&[]), "the same tokens at other positions are no match");
        let s = tree.stats();
        assert_eq!((s.queries, s.hits, s.queried_tokens, s.reused_tokens), (2, 1, 7 + 2, 4));
    }

    #[test]
    fn held_blocks_are_never_evicted_and_idle_ones_go_deepest_and_oldest_first() {
        let mut tree = PrefixTree::default();
        tree.insert(None, &[1, 2], 0).unwrap();
        tree.insert(Some(0), &[3, 4], 1).unwrap();
        tree.insert(None, &[5, 6], 2).unwrap();
        assert_eq!((tree.idle(), tree.evict()), (0, None), "every block is held");
        // The first sequence ends (its leaf first), then the second.
        for b in [1, 0, 2] {
            assert!(tree.release(b));
        }
        assert!(!tree.release(7), "an uncached block is the caller's own");
        assert_eq!(tree.idle(), 3);
        // Block 0 has a child: block 1 goes first, then the older of 0 and 2.
        assert_eq!([tree.evict(), tree.evict(), tree.evict(), tree.evict()], [Some(1), Some(0), Some(2), None]);
        assert_eq!((tree.stats().evictions, tree.stats().cached_blocks, tree.idle()), (3, 0, 0));
    }

    #[test]
    fn a_lookup_takes_idle_blocks_back_from_eviction() {
        let mut tree = PrefixTree::default();
        tree.insert(None, &[1, 2], 0).unwrap();
        tree.release(0);
        assert_eq!(tree.lookup(&[1, 2], TILE), whole(&[0]));
        assert_eq!((tree.idle(), tree.evict()), (0, None));
        tree.release(0);
        assert_eq!(tree.evict(), Some(0));
        assert_eq!(tree.lookup(&[1, 2], TILE), whole(&[]));
    }

    #[test]
    fn inserting_cached_tokens_again_hands_back_the_cached_block() {
        let mut tree = PrefixTree::default();
        tree.insert(None, &[1, 2], 0).unwrap();
        assert_eq!(tree.insert(None, &[1, 2], 5), Err(0));
        // Two holders now: one release leaves it held.
        tree.release(0);
        assert_eq!((tree.idle(), tree.evict()), (0, None));
        tree.release(0);
        assert_eq!(tree.evict(), Some(0));
    }
}
