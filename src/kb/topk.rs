//! The exact BM25 top-k of a keyword query without scoring every match.
//!
//! Each phrase's matches are held as a posting list ([`Postings`]): the chunk ids in order, and
//! each chunk's share of the score (what FTS5's `bm25()` adds for that phrase), also listed best
//! first. [`top`] runs the threshold algorithm over those lists: it walks them best first, scores
//! each chunk it meets in full (looking the chunk up in the other lists), and stops as soon as no
//! chunk it has not met can beat the k-th it holds. The best share left in each list bounds the
//! score of every chunk not met yet, so the cost follows k and how fast the shares fall, not the
//! number of matches.
//!
//! The result is the one scoring every match gives: the same chunks, the same scores (each sum is
//! made in phrase order, as `bm25()` makes it, so the bits agree) and the same order, best score
//! first and ties by lower id.

use std::cmp::Ordering;
use std::collections::BinaryHeap;

/// How the phrases of a query combine: every one must match, or any.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Join {
    All,
    Any,
}

/// One phrase of a MATCH expression this module can run: a term, or a term's start (`"depl"*`).
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Phrase {
    /// Lower-case ASCII letters and digits, as the query wrote it (not stemmed yet).
    pub text: String,
    pub prefix: bool,
}

/// Longer terms are left to FTS5.
const MAX_TERM_BYTES: usize = 256;

/// How many steps of the walk run between two looks at the query's time budget.
const STEPS_PER_CHECK: usize = 1024;

/// The phrases and join of a MATCH expression made by `query::fts_query` (`"a" AND "b"*`, or
/// with `OR`), or `None` for anything else (non-ASCII text, whose folding only FTS5 knows, and
/// expressions mixing AND and OR).
pub fn parse(fts: &str) -> Option<(Vec<Phrase>, Join)> {
    let (parts, join) = if fts.contains(" OR ") {
        (fts.split(" OR ").collect::<Vec<_>>(), Join::Any)
    } else {
        (fts.split(" AND ").collect::<Vec<_>>(), Join::All)
    };
    let mut phrases = Vec::with_capacity(parts.len());
    for part in parts {
        let (quoted, prefix) = match part.strip_suffix('*') {
            Some(quoted) => (quoted, true),
            None => (part, false),
        };
        let text = quoted.strip_prefix('"')?.strip_suffix('"')?;
        // Long words go to FTS5, which cuts tokens its own way.
        if text.is_empty() || text.len() > MAX_TERM_BYTES || !text.bytes().all(|b| b.is_ascii_alphanumeric()) {
            return None;
        }
        phrases.push(Phrase { text: text.to_ascii_lowercase(), prefix });
    }
    Some((phrases, join))
}

/// One phrase's matches, as of one store generation.
pub struct Postings {
    /// Matching chunk ids, ascending.
    ids: Vec<u32>,
    /// The phrase's share of each chunk's score, by the position in `ids`.
    shares: Vec<f64>,
    /// Positions in `ids`, best share first, ties by lower id.
    best_first: Vec<u32>,
    /// For lists of more than one chunk id in 64: a chunk's position in `ids` in constant time
    /// (the lookups of the other phrases are most of the work of a query).
    dense: Option<Dense>,
}

/// The ids of a list as a bitset, with the number of ids before each word of it.
struct Dense {
    bits: Vec<u64>,
    before: Vec<u32>,
}

impl Postings {
    /// The list of `(chunk id, share)` pairs given in ascending id order.
    pub fn new(ids: Vec<u32>, shares: Vec<f64>) -> Postings {
        debug_assert!(ids.windows(2).all(|w| w[0] < w[1]));
        let mut best_first: Vec<u32> = (0..ids.len() as u32).collect();
        // Ties keep the id order (a stable sort of positions that ascend with the ids).
        best_first.sort_by(|a, b| shares[*b as usize].total_cmp(&shares[*a as usize]));
        let span = ids.last().map_or(0, |last| *last as usize + 1);
        let dense = (ids.len() * 64 >= span && !ids.is_empty()).then(|| {
            let mut bits = vec![0u64; span.div_ceil(64)];
            for id in &ids {
                bits[*id as usize >> 6] |= 1 << (id & 63);
            }
            let mut before = Vec::with_capacity(bits.len());
            let mut count = 0u32;
            for word in &bits {
                before.push(count);
                count += word.count_ones();
            }
            Dense { bits, before }
        });
        Postings { ids, shares, best_first, dense }
    }

    pub fn is_empty(&self) -> bool {
        self.ids.is_empty()
    }

    fn len(&self) -> usize {
        self.ids.len()
    }

    /// Bytes held, for the cache's bound.
    pub fn bytes(&self) -> usize {
        let dense = self.dense.as_ref().map_or(0, |d| d.bits.len() * 8 + d.before.len() * 4);
        self.ids.len() * (4 + 8 + 4) + dense
    }

    fn share_of(&self, id: u32) -> Option<f64> {
        let at = match &self.dense {
            Some(dense) => {
                let word = *dense.bits.get(id as usize >> 6)?;
                let bit = 1u64 << (id & 63);
                if word & bit == 0 {
                    return None;
                }
                dense.before[id as usize >> 6] as usize + (word & (bit - 1)).count_ones() as usize
            }
            None => self.ids.binary_search(&id).ok()?,
        };
        Some(self.shares[at])
    }

    /// The entry `depth` places down the best-first order: `(id, share)`.
    fn at_depth(&self, depth: usize) -> Option<(u32, f64)> {
        let at = *self.best_first.get(depth)? as usize;
        Some((self.ids[at], self.shares[at]))
    }
}

/// A scored chunk; `Ord` puts the better one first (higher score, then lower id).
#[derive(Clone, Copy, Debug, PartialEq)]
struct Scored {
    id: u32,
    score: f64,
}

impl Eq for Scored {}

impl Ord for Scored {
    fn cmp(&self, other: &Self) -> Ordering {
        other.score.total_cmp(&self.score).then(self.id.cmp(&other.id))
    }
}

impl PartialOrd for Scored {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}

/// The `k` best chunks for `lists` (one per phrase, in the query's phrase order) joined by
/// `join`, among chunks `keep` accepts: `(id, score)`, best first, ties by lower id. `None`
/// when the query's time budget (`kb::budget`) ran out first: the walk is plain Rust, which
/// SQLite's progress handler never sees, so it looks at the budget itself.
pub fn top(lists: &[&Postings], join: Join, k: usize, keep: &dyn Fn(u32) -> bool) -> Option<Vec<(u32, f64)>> {
    if k == 0 || lists.is_empty() || (join == Join::All && lists.iter().any(|l| l.is_empty())) {
        return Some(Vec::new());
    }
    // The k best so far; the top of this heap is the worst of them (`Scored` orders better first).
    let mut held: BinaryHeap<Scored> = BinaryHeap::with_capacity(k + 1);
    // Chunks already scored (or turned away), as a bitset over the ids of the lists.
    let span = lists.iter().filter_map(|l| l.ids.last()).max().map_or(0, |last| *last as usize + 1);
    let mut met = vec![0u64; span.div_ceil(64)];
    // For AND, the shortest lists are asked first: they turn a chunk away soonest.
    let mut shortest_first: Vec<usize> = (0..lists.len()).collect();
    shortest_first.sort_by_key(|&i| lists[i].len());
    let mut depth = vec![0usize; lists.len()];
    let mut steps = 0usize;
    loop {
        steps += 1;
        if steps.is_multiple_of(STEPS_PER_CHECK) && super::budget::exceeded() {
            return None;
        }
        // The best share not walked yet in each list: the bound of every chunk not met.
        let frontier: Vec<Option<(u32, f64)>> = lists.iter().zip(&depth).map(|(l, d)| l.at_depth(*d)).collect();
        if join == Join::All && frontier.iter().any(Option::is_none) {
            // Every chunk of a walked-through list has been scored: nothing else has every phrase.
            break;
        }
        if frontier.iter().all(Option::is_none) {
            break;
        }
        if held.len() == k && cannot_beat(&frontier, held.peek().expect("k > 0")) {
            break;
        }
        // Walk the list whose next share is highest (the first such list on a tie).
        let mut best: Option<(usize, u32, f64)> = None;
        for (i, (id, share)) in frontier.iter().enumerate().filter_map(|(i, f)| f.map(|f| (i, f))) {
            if best.is_none_or(|(_, _, b)| share > b) {
                best = Some((i, id, share));
            }
        }
        let (next, id, _) = best.expect("a list with entries left");
        depth[next] += 1;
        let (word, bit) = (id as usize >> 6, 1u64 << (id & 63));
        if met[word] & bit != 0 {
            continue;
        }
        met[word] |= bit;
        if !keep(id)
            || (join == Join::All && shortest_first.iter().any(|&i| i != next && lists[i].share_of(id).is_none()))
        {
            continue;
        }
        let Some(score) = score(lists, join, id) else { continue };
        let candidate = Scored { id, score };
        if held.len() < k {
            held.push(candidate);
        } else if candidate < *held.peek().expect("k > 0") {
            held.pop();
            held.push(candidate);
        }
    }
    Some(held.into_sorted_vec().into_iter().map(|s| (s.id, s.score)).collect())
}

/// Whether no chunk that has not been met can beat `worst`, the k-th held.
///
/// A chunk not met sits at or below the frontier of every list that has it, so its score is at
/// most the frontier's sum (made in phrase order, as its own score is: rounding is monotonic, so
/// the bound holds in floating point too). An equal bound settles it only when one list is left:
/// the chunk's score is then its share in that list, equal to the frontier's only with an id at
/// or past the frontier's (ties are listed by id), so it beats `worst` only with a lower id than
/// that. With more lists an equal sum can come from shares below the frontier (rounding makes
/// `fl(a - ulp + b) == fl(a + b)`), so the walk goes on.
fn cannot_beat(frontier: &[Option<(u32, f64)>], worst: &Scored) -> bool {
    let mut bound = 0.0f64;
    let mut live = 0;
    let mut last_id = 0u32;
    for (id, share) in frontier.iter().flatten() {
        bound += share;
        live += 1;
        last_id = *id;
    }
    match bound.total_cmp(&worst.score) {
        Ordering::Less => true,
        // An equal id would be `worst` itself, which has been met.
        Ordering::Equal => live == 1 && last_id >= worst.id,
        Ordering::Greater => false,
    }
}

/// The full score of `id`: each phrase's share in phrase order (a phrase it lacks adds nothing,
/// as in `bm25()`), or `None` when `join` is `All` and a phrase is missing.
fn score(lists: &[&Postings], join: Join, id: u32) -> Option<f64> {
    let mut score = 0.0f64;
    for list in lists {
        match list.share_of(id) {
            Some(share) => score += share,
            None if join == Join::All => return None,
            None => {}
        }
    }
    Some(score)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every match scored, then sorted: what the threshold algorithm must equal.
    fn exhaustive(lists: &[&Postings], join: Join, k: usize, keep: &dyn Fn(u32) -> bool) -> Vec<(u32, f64)> {
        let mut ids: Vec<u32> = lists.iter().flat_map(|l| l.ids.iter().copied()).collect();
        ids.sort_unstable();
        ids.dedup();
        let mut all: Vec<Scored> = ids
            .into_iter()
            .filter(|id| keep(*id))
            .filter_map(|id| score(lists, join, id).map(|score| Scored { id, score }))
            .collect();
        all.sort();
        all.truncate(k);
        all.into_iter().map(|s| (s.id, s.score)).collect()
    }

    /// A small deterministic generator (xorshift), so failures repeat.
    struct Rng(u64);
    impl Rng {
        fn next(&mut self) -> u64 {
            self.0 ^= self.0 << 13;
            self.0 ^= self.0 >> 7;
            self.0 ^= self.0 << 17;
            self.0
        }
        fn below(&mut self, n: u64) -> u64 {
            self.next() % n
        }
    }

    /// A list over `universe` ids with density `1/every`, its shares drawn from `levels` values:
    /// few levels make many ties.
    fn list(rng: &mut Rng, universe: u32, every: u64, levels: u64) -> Postings {
        let ids: Vec<u32> = (0..universe).filter(|_| rng.below(every) == 0).collect();
        let shares = ids.iter().map(|_| 0.5 + (1 + rng.below(levels)) as f64 * 0.37).collect();
        Postings::new(ids, shares)
    }

    #[test]
    fn parses_only_what_fts_query_makes() {
        let phrase = |text: &str, prefix| Phrase { text: text.into(), prefix };
        assert_eq!(parse("\"Deploy\""), Some((vec![phrase("deploy", false)], Join::All)));
        assert_eq!(parse("\"a\" AND \"b1\"*"), Some((vec![phrase("a", false), phrase("b1", true)], Join::All)));
        assert_eq!(parse("\"a\" OR \"b\"*").map(|p| p.1), Some(Join::Any));
        assert_eq!(parse("\"café\""), None);
        assert_eq!(parse("\"a\" AND \"b\" OR \"c\""), None);
        assert_eq!(parse("a"), None);
        assert_eq!(parse("\"\""), None);
        assert_eq!(parse("\"a b\""), None);
    }

    #[test]
    fn equals_scoring_every_match_on_random_lists_with_ties_and_filters() {
        let mut rng = Rng(0x9e37_79b9_7f4a_7c15);
        for round in 0..400 {
            let universe = 1 + rng.below(3_000) as u32;
            let phrases = 1 + rng.below(4) as usize;
            let levels = [1, 2, 3, 50, 100_000][rng.below(5) as usize];
            let lists: Vec<Postings> = (0..phrases)
                .map(|_| {
                    let every = 1 + rng.below(150);
                    list(&mut rng, universe, every, levels)
                })
                .collect();
            let refs: Vec<&Postings> = lists.iter().collect();
            let modulus = 1 + rng.below(4) as u32;
            let keep = move |id: u32| id.is_multiple_of(modulus);
            for join in [Join::All, Join::Any] {
                for k in [1, 3, 10, 30, 200] {
                    let want = exhaustive(&refs, join, k, &keep);
                    let got = top(&refs, join, k, &keep).expect("no budget, no interruption");
                    assert_eq!(got, want, "round {round}: {join:?}, k {k}, {phrases} phrases, {levels} levels");
                }
            }
        }
    }

    /// The reviewer's case: shares one ulp apart whose sums round to the same score. The chunk
    /// with the lower id has the lower share in one list; it must still win the tie.
    #[test]
    fn an_equal_sum_from_lower_shares_is_still_found() {
        let ulp = f64::EPSILON * 2.0; // one ulp at 3.x
        let a = 3.0 + 3.0 * 2f64.powi(-51);
        let b = 1.0 + 2f64.powi(-51);
        assert_eq!((a - ulp) + b, a + b, "the sums round together");
        let first = Postings::new(vec![1, 5, 9], vec![a - ulp, a, a]);
        let second = Postings::new(vec![0, 1, 5, 9], vec![b, b, b, b]);
        let lists = [&first, &second];
        let want = exhaustive(&lists, Join::All, 1, &|_| true);
        assert_eq!(want[0].0, 1);
        assert_eq!(top(&lists, Join::All, 1, &|_| true), Some(want));
    }

    /// A long walk (ties keep it going to the end of both lists) stops when the query's budget
    /// is used up, and says so; without a budget it runs to the end.
    #[test]
    fn a_long_walk_stops_at_the_budget() {
        let ids: Vec<u32> = (0..20_000).collect();
        let first = Postings::new(ids.clone(), vec![1.0; ids.len()]);
        let second = Postings::new(ids.clone(), vec![1.0; ids.len()]);
        let lists = [&first, &second];
        let zero = crate::kb::budget::within(std::time::Duration::ZERO, || top(&lists, Join::Any, 10, &|_| true));
        assert_eq!(zero, None, "interrupted and reported so");
        let unbounded = top(&lists, Join::Any, 10, &|_| true).expect("no budget");
        assert_eq!(unbounded.iter().map(|p| p.0).collect::<Vec<_>>(), (0..10).collect::<Vec<u32>>());
    }

    #[test]
    fn a_repeated_list_counts_twice_like_a_repeated_phrase() {
        let one = Postings::new(vec![1, 2, 3], vec![1.0, 3.0, 2.0]);
        assert_eq!(top(&[&one, &one], Join::All, 2, &|_| true), Some(vec![(2, 6.0), (3, 4.0)]));
    }
}
