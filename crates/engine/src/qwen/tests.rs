use super::*;
use crate::kernel::tests::data;

#[test]
fn a_projection_gives_a_row_the_same_bits_alone_as_in_a_prefill_chunk() {
    // A chunk past a group of eight rows, a narrow last panel, a bias, every weight dtype;
    // an odd and an even number of inputs (BF16 pairs them only when even).
    for (out, k, rows) in [(70, 75, 21), (70, 76, 21)] {
        let w = Tensor::from_vec(data(out * k, 30), (out, k), &Device::Cpu).unwrap();
        let bias = data(out, 31);
        let x = Tensor::from_vec(data(rows * k, 32), (rows, k), &Device::Cpu).unwrap();
        let whole = [Matrix::tensor(w.clone()).unwrap()];
        // The same rows in two parts, split inside a panel (as q/k/v and gate/up are stacked).
        let parts =
            [33, out - 33].map(|n| Matrix::tensor(w.narrow(0, if n == 33 { 0 } else { 33 }, n).unwrap()).unwrap());
        let cpu = &Device::Cpu;
        for dtype in [WeightDtype::F32, WeightDtype::F16, WeightDtype::Bf16] {
            let in_panels = Proj::new(&whole, Some(bias.clone()), dtype, true, cpu).unwrap();
            let in_rows = Proj::new(&whole, Some(bias.clone()), dtype, false, cpu).unwrap();
            let stacked = Proj::new(&parts, Some(bias.clone()), dtype, true, cpu).unwrap();
            assert_eq!(stacked.outputs(&x).unwrap(), in_panels.outputs(&x).unwrap(), "{}: parts", dtype.name());
            let layout = |p: &Proj| match &p.w {
                Stored::Dense { layout, .. } => *layout,
                Stored::Blocks(_) => panic!("checkpoint matrices are laid out"),
            };
            let paired = layout(&in_panels).paired();
            assert_eq!(paired, dtype == WeightDtype::Bf16 && k % 2 == 0);
            assert_ne!(layout(&in_panels), layout(&in_rows));
            let chunk = in_panels.outputs(&x).unwrap();
            for r in [0, 7, 8, 20] {
                let alone = in_panels.outputs(&x.narrow(0, r, 1).unwrap()).unwrap();
                assert_eq!(alone, chunk[r * out..(r + 1) * out], "{} row {r}", dtype.name());
            }
            // As rows, the same values summed in another order: equal within rounding (and
            // within the activations' rounding to BF16 where the inputs are paired).
            let tolerance = if paired { 2e-2 } else { 1e-5 };
            for (a, b) in chunk.iter().zip(&in_rows.outputs(&x).unwrap()) {
                assert!((a - b).abs() <= tolerance * (1.0 + b.abs()), "{}: {a} vs {b}", dtype.name());
            }
        }
    }
}

#[test]
fn a_forward_longer_than_a_slice_gives_the_bits_of_chunks_within_one() {
    let (_tmp, loaded) = crate::stepper::tests::tiny();
    let model = &loaded.model;
    let (long, short): (Vec<u32>, Vec<u32>) = ((1..=2 * SLICE_ROWS as u32 + 77).collect(), (500..540).collect());
    // Reference: each prompt in chunks below a slice, alone, so nothing is sliced.
    let chunked = |tokens: &[u32]| -> Vec<f32> {
        let mut cache = model.new_cache(tokens.len()).unwrap();
        let mut logits = None;
        for chunk in tokens.chunks(SLICE_ROWS / 3) {
            logits = Some(model.forward(&mut cache, chunk).unwrap());
        }
        logits.unwrap().to_vec1::<f32>().unwrap()
    };
    let (long_ref, short_ref) = (chunked(&long), chunked(&short));
    // The long prompt whole: three slices.
    let mut cache = model.new_cache(long.len()).unwrap();
    let whole = model.forward(&mut cache, &long).unwrap().to_vec1::<f32>().unwrap();
    assert_eq!(bits(&whole), bits(&long_ref));
    assert_eq!(cache.len(), long.len());
    // Both in one forward, the short one after the long: it shares the last slice.
    let (mut a, mut b) = (model.new_cache(long.len()).unwrap(), model.new_cache(short.len()).unwrap());
    let both = model.forward_batch(&mut [(&mut a, &long[..]), (&mut b, &short[..])]).unwrap();
    assert_eq!(bits(&both.get(0).unwrap().to_vec1::<f32>().unwrap()), bits(&long_ref));
    assert_eq!(bits(&both.get(1).unwrap().to_vec1::<f32>().unwrap()), bits(&short_ref));
    // And the short one first: the long one starts in the first slice beside it.
    let (mut a, mut b) = (model.new_cache(long.len()).unwrap(), model.new_cache(short.len()).unwrap());
    // The short one's greedy id through the screen, the long one's logits in full.
    let next = model.next_batch(&mut [(&mut b, &short[..]), (&mut a, &long[..])], &[Want::Greedy, Want::Logits]);
    let argmax = |v: &[f32]| v.iter().enumerate().fold(0, |best, (i, x)| if *x > v[best] { i } else { best }) as u32;
    let values = |c: &[(u32, f32)]| c.iter().map(|(_, l)| *l).collect::<Vec<_>>();
    match &next.unwrap()[..] {
        [Next::Id(id), Next::Candidates(logits)] => {
            assert_eq!(*id, argmax(&short_ref));
            assert_eq!(bits(&values(logits)), bits(&long_ref));
        }
        other => panic!("asked for an id and logits, got {other:?}"),
    }
    // The top 40 through the screen: the full logits' ids that reach the 40th largest are
    // among the candidates, each with its full product's bits.
    let mut c = model.new_cache(short.len()).unwrap();
    let Next::Candidates(top) = model.next_batch(&mut [(&mut c, &short[..])], &[Want::Top(40)]).unwrap().remove(0)
    else {
        panic!("asked for candidates")
    };
    let mut sorted = short_ref.clone();
    sorted.sort_by(|a, b| b.total_cmp(a));
    assert!(top.len() >= 40 && top.len() < short_ref.len() / 4, "{} candidates", top.len());
    for (id, logit) in &top {
        assert_eq!(logit.to_bits(), short_ref[*id as usize].to_bits());
    }
    let reaching = short_ref.iter().filter(|l| **l >= sorted[39]).count();
    assert_eq!(top.iter().filter(|(_, l)| *l >= sorted[39]).count(), reaching);
    // So top-k sampling draws from the same distribution either way.
    let sampling = crate::sample::Sampling { temperature: 0.7, top_k: 40, top_p: 0.9, ..Default::default() };
    assert_eq!(sampling.distribution(top, &[]), sampling.distribution(crate::sample::every(&short_ref), &[]));
    // A forward past its cache is refused before any slice is computed.
    let mut small = model.new_cache(SLICE_ROWS).unwrap();
    assert!(model.forward(&mut small, &long).is_err());
    assert_eq!(small.len(), 0);
}

/// A cache in `pool` for `tokens`: the cached prefix taken (all but the last token may be),
/// the rest computed, its full blocks shared and its last partial one kept, as a finished
/// session's are; returns the positions reused and the last position's logits.
fn run(model: &Qwen2, pool: &std::sync::Arc<KvPool>, tokens: &[u32]) -> (usize, Vec<f32>) {
    let mut cache = model.cache_in(pool, 512);
    let reused = cache.attach(&tokens[..tokens.len() - 1]);
    let logits = model.forward(&mut cache, &tokens[reused..]).unwrap().to_vec1::<f32>().unwrap();
    cache.share(tokens);
    cache.keep_tail(tokens);
    (reused, logits)
}

fn bits(v: &[f32]) -> Vec<u32> {
    v.iter().map(|x| x.to_bits()).collect()
}

#[test]
fn the_pool_turns_positions_and_bytes_into_whole_blocks() {
    let (_tmp, loaded) = crate::stepper::tests::tiny();
    let model = &loaded.model;
    let block = KvPool::BLOCK_POSITIONS;
    // A request's positions round up to whole blocks; a budget's round down.
    assert_eq!([KvPool::blocks_for(0), KvPool::blocks_for(1), KvPool::blocks_for(block)], [0, 1, 1]);
    assert_eq!(KvPool::blocks_for(block + 1), 2);
    assert_eq!([KvPool::blocks_within(block - 1), KvPool::blocks_within(2 * block + 1)], [0, 2]);
    // Bytes are whole positions of this model: three blocks' bytes are three blocks.
    assert_eq!(model.position_bytes() * block, model.block_bytes());
    let bytes = 3 * model.block_bytes() as u64;
    assert_eq!(model.budget_positions(KvBudget::Bytes(bytes)), 3 * block);
    assert_eq!(model.budget_positions(KvBudget::Bytes(bytes + 1)), 3 * block);
    assert_eq!(model.budget_positions(KvBudget::Positions(100)), 100);
    // A pool within a budget holds its whole blocks, at least one.
    let pool = model.kv_pool_within(3 * block + 5, false).unwrap();
    assert_eq!((pool.blocks(), pool.positions()), (3, 3 * block));
    assert_eq!(model.kv_pool_within(1, false).unwrap().blocks(), 1);
}

#[test]
fn a_cached_prefix_gives_the_logits_computing_it_gives_bit_for_bit() {
    let (_tmp, loaded) = crate::stepper::tests::tiny();
    let model = &loaded.model;
    let first: Vec<u32> = (1..=200).collect();
    // Shares 150 tokens with the first: two whole blocks and 22 positions of the third.
    let second: Vec<u32> = first[..150].iter().copied().chain(300..340).collect();
    let pool = model.kv_pool(16, true).unwrap();
    assert_eq!(run(model, &pool, &first).0, 0, "an empty cache has nothing to give");
    assert_eq!(pool.used_blocks(), 0, "a dropped cache's blocks are idle in the prefix cache");
    let (reused, hit) = run(model, &pool, &second);
    assert_eq!(reused, 150);
    let alone = model.kv_pool(16, false).unwrap();
    let (none, computed) = run(model, &alone, &second);
    assert_eq!(none, 0, "a pool that does not reuse finds nothing");
    assert_eq!(bits(&hit), bits(&computed), "the reused keys and values are the computed ones");
    // The same prompt again: all but its last token comes cached, its tail from the block
    // the first run left partly filled.
    let (again, logits) = run(model, &pool, &first);
    assert_eq!(again, first.len() - 1);
    assert_eq!(bits(&logits), bits(&run(model, &alone, &first).1));
    let s = pool.prefix_stats();
    assert_eq!((s.queries, s.hits, s.reused_tokens, s.evictions), (3, 2, 150 + 199, 0));
    assert_eq!(alone.prefix_stats(), crate::prefix::PrefixStats::default());
    assert_eq!(pool.used_blocks(), 0, "the blocks copied from are given back");
}

#[test]
fn cached_blocks_give_way_to_new_work_and_the_budget_is_kept() {
    let (_tmp, loaded) = crate::stepper::tests::tiny();
    let model = &loaded.model;
    let pool = model.kv_pool(4, true).unwrap();
    let first: Vec<u32> = (1..=200).collect();
    run(model, &pool, &first);
    // Three full blocks and the partial last one stay cached, idle: all four can be taken.
    assert_eq!((pool.free_blocks(), pool.prefix_stats().cached_blocks), (4, 4));
    let other: Vec<u32> = (500..756).collect();
    let (reused, _) = run(model, &pool, &other);
    assert_eq!(reused, 0);
    let s = pool.prefix_stats();
    assert_eq!(s.evictions, 4, "the cached blocks were taken back for the new prompt");
    assert_eq!(s.cached_blocks, 4, "whose own four full blocks are cached now");
    assert_eq!(pool.peak_bytes(), 4 * pool.block_bytes());
    assert_eq!(run(model, &pool, &first).0, 0, "the first prompt's blocks are gone");
}
