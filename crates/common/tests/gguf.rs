//! GGUF export: the file reads back with the weights, shapes, types and metadata llama.cpp's
//! `qwen2` architecture expects.

mod support;

use candle_core::quantized::{gguf_file, GgmlDType};
use candle_core::{DType, Device, Tensor};
use common::gguf::{export, gguf_name, WeightType};

fn read_back(path: &std::path::Path) -> (gguf_file::Content, std::fs::File) {
    let mut file = std::fs::File::open(path).unwrap();
    (gguf_file::Content::read(&mut file).unwrap(), file)
}

fn max_abs_diff(a: &Tensor, b: &Tensor) -> f32 {
    (a - b).unwrap().abs().unwrap().flatten_all().unwrap().max(0).unwrap().to_scalar::<f32>().unwrap()
}

#[test]
fn exports_read_back_with_their_weights_and_metadata() {
    let dir = support::tiny_dir();
    let source = candle_core::safetensors::load(dir.join("model.safetensors"), &Device::Cpu).unwrap();
    let tmp = tempfile::tempdir().unwrap();
    // A 4-bit value is off by at most half a step (a thirtieth of its block's range, Q4_1), or
    // by a whole one at the clamped end of Q4_0's scale (an eighth of its block's magnitude).
    let types = [
        (WeightType::F32, 0.0),
        (WeightType::F16, 2e-3),
        (WeightType::Q8_0, 2e-2),
        (WeightType::Q4_0, 0.13),
        (WeightType::Q4_1, 7e-2),
    ];
    for (ty, tolerance) in types {
        let out = tmp.path().join(format!("tiny-{ty:?}.gguf"));
        let exported = export(&dir, &out, ty).unwrap();
        assert_eq!(exported.tensors, 2 + 3 * 12);
        let (content, mut file) = read_back(&out);
        let meta = |k: &str| content.metadata.get(k).unwrap_or_else(|| panic!("no {k}"));
        assert_eq!(meta("general.architecture").to_string().unwrap(), "qwen2");
        assert_eq!(meta("qwen2.block_count").to_u32().unwrap(), 3);
        assert_eq!(meta("qwen2.attention.head_count").to_u32().unwrap(), 4);
        assert_eq!(meta("qwen2.attention.head_count_kv").to_u32().unwrap(), 2);
        assert_eq!(meta("qwen2.rope.freq_base").to_f32().unwrap(), 1_000_000.0);
        assert_eq!(meta("tokenizer.ggml.tokens").to_vec().unwrap().len(), 1152);
        let model = common::load::LoadedModel::load(&dir).unwrap();
        assert_eq!(
            meta("tokenizer.ggml.eos_token_id").to_u32().unwrap(),
            model.tokenizer.token_to_id("<|im_end|>").unwrap()
        );
        assert!(meta("tokenizer.chat_template").to_string().unwrap().contains("<|im_start|>"));
        assert_eq!(content.tensor_infos.len(), 38);

        for (hf, original) in &source {
            let name = gguf_name(hf).unwrap();
            let info = &content.tensor_infos[&name];
            assert_eq!(info.shape.dims(), original.dims(), "{name}");
            let expected_type = match (ty, original.rank()) {
                (_, 1) | (WeightType::F32, _) => GgmlDType::F32,
                (WeightType::F16, _) => GgmlDType::F16,
                (_, _) if original.dims()[1] % 32 != 0 => GgmlDType::F16,
                (WeightType::Q8_0, _) => GgmlDType::Q8_0,
                (WeightType::Q4_0, _) => GgmlDType::Q4_0,
                (WeightType::Q4_1, _) => GgmlDType::Q4_1,
            };
            assert_eq!(info.ggml_dtype, expected_type, "{name}");
            let back = content.tensor(&mut file, &name, &Device::Cpu).unwrap().dequantize(&Device::Cpu).unwrap();
            let original = original.to_dtype(DType::F32).unwrap();
            let scale = original.abs().unwrap().flatten_all().unwrap().max(0).unwrap().to_scalar::<f32>().unwrap();
            assert!(max_abs_diff(&back, &original) <= tolerance * scale.max(1.0), "{name} {ty:?}");
        }
        if matches!(ty, WeightType::Q8_0 | WeightType::Q4_0 | WeightType::Q4_1) {
            assert_eq!(exported.fallbacks.len(), 3, "ffn_down rows of 176 do not split into 32-value blocks");
        }
        // Never over an existing file.
        assert!(export(&dir, &out, ty).unwrap_err().to_string().contains("already exists"));
    }
}

#[test]
fn every_qwen2_tensor_has_a_gguf_name() {
    let shape = common::generate::shape("qwen2.5-0.5b").unwrap();
    for (name, _) in common::generate::tensor_layout(&shape, 151_936) {
        assert!(gguf_name(&name).is_some(), "{name}");
    }
    assert_eq!(gguf_name("model.layers.23.mlp.down_proj.weight").as_deref(), Some("blk.23.ffn_down.weight"));
    assert_eq!(gguf_name("model.rotary.inv_freq"), None);
}

fn greedy(model: &common::load::LoadedModel, prompt: &str, n: usize) -> Vec<u32> {
    let (_, ids) = model.encode_user_prompt(prompt).unwrap();
    let mut s = common::session::Session::new(model, ids, n).unwrap();
    while !s.is_finished() {
        s.step(None).unwrap();
    }
    s.output().to_vec()
}

const PROMPT: &str = "Explain cache invalidation in one sentence.";

#[test]
fn a_qwen2_export_loads_as_the_checkpoint_it_came_from() {
    use common::load::{Architecture, Format, LoadedModel};
    let folder = LoadedModel::load(&support::tiny_dir()).unwrap();
    let file = LoadedModel::load(&support::tiny_gguf()).unwrap();
    assert_eq!((file.format, file.architecture), (Format::Gguf, Architecture::Qwen2));
    let c = (&folder.config, &file.config);
    assert_eq!((c.0.hidden_size, c.0.num_hidden_layers, c.0.num_key_value_heads), (c1(c.1).0, c1(c.1).1, c1(c.1).2));
    assert_eq!(
        (c.0.rope_theta, c.0.vocab_size, c.0.max_position_embeddings),
        (c.1.rope_theta, c.1.vocab_size, c.1.max_position_embeddings)
    );
    assert_eq!(folder.encode_user_prompt(PROMPT).unwrap(), file.encode_user_prompt(PROMPT).unwrap());
    assert!(file.stop_ids.iter().all(|id| folder.stop_ids.contains(id)), "{:?} {:?}", file.stop_ids, folder.stop_ids);
    // The same F32 weights through the same forward: the same ids.
    assert_eq!(greedy(&folder, PROMPT, 24), greedy(&file, PROMPT, 24));
}

fn c1(c: &candle_transformers::models::qwen2::Config) -> (usize, usize, usize) {
    (c.hidden_size, c.num_hidden_layers, c.num_key_value_heads)
}

/// The tiny export rewritten: `edit` changes its metadata and its tensors (as F32 values and the
/// type each is stored in) before it is written to `out`.
fn rewrite(
    out: &std::path::Path,
    edit: impl FnOnce(&mut Vec<(String, gguf_file::Value)>, &mut Vec<(String, Tensor, GgmlDType)>),
) {
    let (content, mut file) = read_back(&support::tiny_gguf());
    let mut metadata: Vec<(String, gguf_file::Value)> = content.metadata.clone().into_iter().collect();
    metadata.sort_by(|a, b| a.0.cmp(&b.0));
    let mut names: Vec<&String> = content.tensor_infos.keys().collect();
    names.sort();
    let mut tensors: Vec<(String, Tensor, GgmlDType)> = names
        .into_iter()
        .map(|name| {
            let q = content.tensor(&mut file, name, &Device::Cpu).unwrap();
            (name.clone(), q.dequantize(&Device::Cpu).unwrap(), content.tensor_infos[name].ggml_dtype)
        })
        .collect();
    edit(&mut metadata, &mut tensors);
    let quantized: Vec<(String, candle_core::quantized::QTensor)> = tensors
        .iter()
        .map(|(name, t, ty)| (name.clone(), candle_core::quantized::QTensor::quantize(t, *ty).unwrap()))
        .collect();
    let meta: Vec<(&str, &gguf_file::Value)> = metadata.iter().map(|(k, v)| (k.as_str(), v)).collect();
    let tensor_refs: Vec<(&str, &candle_core::quantized::QTensor)> =
        quantized.iter().map(|(k, v)| (k.as_str(), v)).collect();
    let mut w = std::io::BufWriter::new(std::fs::File::create(out).unwrap());
    gguf_file::write(&mut w, &meta, &tensor_refs).unwrap();
}

fn set(metadata: &mut [(String, gguf_file::Value)], key: &str, value: gguf_file::Value) {
    metadata.iter_mut().find(|(k, _)| k == key).unwrap_or_else(|| panic!("no {key}")).1 = value;
}

/// GGUF's row order of a Llama q or k matrix, as the converter writes it: within each head,
/// checkpoint row `s·d/2 + i` becomes row `2i + s`.
fn permute(w: &Tensor, heads: usize) -> Tensor {
    let (rows, cols) = w.dims2().unwrap();
    let d = rows / heads;
    w.reshape((heads, 2, d / 2, cols))
        .unwrap()
        .transpose(1, 2)
        .unwrap()
        .contiguous()
        .unwrap()
        .reshape((rows, cols))
        .unwrap()
}

#[test]
fn a_llama_file_is_the_same_model_without_biases_and_with_its_rows_permuted() {
    // The tiny weights with zero q/k/v biases, once as qwen2 and once as llama: the llama file
    // has no biases, its keys are renamed and its q and k rows are in GGUF's order. Both must
    // compute the same ids; a wrong row order would not.
    let tmp = tempfile::tempdir().unwrap();
    let (qwen, llama) = (tmp.path().join("qwen2.gguf"), tmp.path().join("llama.gguf"));
    let zero_biases = |tensors: &mut Vec<(String, Tensor, GgmlDType)>| {
        for (name, t, _) in tensors.iter_mut() {
            if name.ends_with(".bias") {
                *t = t.zeros_like().unwrap();
            }
        }
    };
    rewrite(&qwen, |_, tensors| zero_biases(tensors));
    rewrite(&llama, |metadata, tensors| {
        let (heads, kv_heads) = (4, 2);
        tensors.retain(|(name, _, _)| !name.ends_with(".bias"));
        for (name, t, _) in tensors.iter_mut() {
            if name.ends_with("attn_q.weight") {
                *t = permute(t, heads);
            } else if name.ends_with("attn_k.weight") {
                *t = permute(t, kv_heads);
            }
        }
        for (key, _) in metadata.iter_mut() {
            if let Some(rest) = key.strip_prefix("qwen2.") {
                *key = format!("llama.{rest}");
            }
        }
        set(metadata, "general.architecture", gguf_file::Value::String("llama".into()));
    });
    let qwen = common::load::LoadedModel::load(&qwen).unwrap();
    let llama = common::load::LoadedModel::load(&llama).unwrap();
    assert_eq!(llama.architecture, common::load::Architecture::Llama);
    let ids = greedy(&qwen, PROMPT, 24);
    assert_eq!(greedy(&llama, PROMPT, 24), ids);
    // The biases matter: the unmodified export computes other ids.
    assert_ne!(greedy(&common::load::LoadedModel::load(&support::tiny_gguf()).unwrap(), PROMPT, 24), ids);
}

#[test]
fn files_this_engine_cannot_run_are_refused_by_name() {
    let tmp = tempfile::tempdir().unwrap();
    let err =
        |name: &str, edit: &dyn Fn(&mut Vec<(String, gguf_file::Value)>, &mut Vec<(String, Tensor, GgmlDType)>)| {
            let path = tmp.path().join(format!("{name}.gguf"));
            rewrite(&path, edit);
            match common::load::LoadedModel::load(&path) {
                Ok(_) => panic!("{name} loaded"),
                Err(e) => e.to_string(),
            }
        };
    let e = err("arch", &|m, _| set(m, "general.architecture", gguf_file::Value::String("falcon".into())));
    assert!(e.starts_with("arch.gguf: architecture `falcon`") && e.contains("llama and qwen2"), "{e}");
    let e = err("pre", &|m, _| set(m, "tokenizer.ggml.pre", gguf_file::Value::String("gpt-4o".into())));
    assert!(e.starts_with("pre.gguf:") && e.contains("pre-tokenizer `gpt-4o`"), "{e}");
    let e = err("model", &|m, _| set(m, "tokenizer.ggml.model", gguf_file::Value::String("llama".into())));
    assert!(e.contains("tokenizer `llama`") && e.contains("gpt2"), "{e}");
    let e = err("type", &|_, t| {
        t.iter_mut().filter(|(n, _, _)| n == "blk.0.attn_q.weight").for_each(|x| x.2 = GgmlDType::Q5_0)
    });
    assert!(e.contains("tensor `blk.0.attn_q.weight` is Q5_0") && e.contains("Q4_K"), "{e}");
    let e = err("heads", &|m, _| set(m, "qwen2.attention.head_count", gguf_file::Value::U32(5)));
    assert!(e.contains("qwen2.attention.head_count") && e.contains("5 heads"), "{e}");
    let e = err("missing", &|m, _| m.retain(|(k, _)| k != "qwen2.block_count"));
    assert!(e.contains("metadata `qwen2.block_count` is missing"), "{e}");
    let e = err("tensor", &|_, t| t.retain(|(n, _, _)| n != "blk.2.ffn_up.weight"));
    assert!(e.contains("ffn_up"), "{e}");
    let e = err("shape", &|_, t| {
        t.iter_mut()
            .filter(|(n, _, _)| n == "blk.1.ffn_down.weight")
            .for_each(|x| x.1 = x.1.t().unwrap().contiguous().unwrap())
    });
    assert!(e.starts_with("shape.gguf: tensor `blk.1.ffn_down.weight` is") && e.contains("expected"), "{e}");
    let e = err("context", &|m, _| set(m, "qwen2.context_length", gguf_file::Value::U32(u32::MAX)));
    assert!(e.contains("qwen2.context_length") && e.contains("at most 2097152 positions"), "{e}");
    let e = err("vocab", &|m, _| m.push(("qwen2.vocab_size".into(), gguf_file::Value::U32(1000))));
    assert!(e.contains("tokenizer.ggml.tokens") && e.contains("vocabulary of 1000"), "{e}");
    let e = err("template", &|m, _| m.retain(|(k, _)| k != "tokenizer.chat_template"));
    assert!(e.contains("no tokenizer.chat_template"), "{e}");

    // Cut short anywhere, a file is an error naming it, never a panic.
    let whole = std::fs::read(support::tiny_gguf()).unwrap();
    for cut in [0, 3, 24, 1000, whole.len() / 2, whole.len() - 1] {
        let path = tmp.path().join("cut.gguf");
        std::fs::write(&path, &whole[..cut]).unwrap();
        let e = common::load::LoadedModel::load(&path).err().unwrap().to_string();
        assert!(e.starts_with("cut.gguf:"), "{cut}: {e}");
    }
}

#[test]
fn an_unpinned_gguf_file_is_recorded_by_its_digest() {
    let file = support::tiny_gguf();
    let resolved = common::resolve::resolve_unpinned(&file).unwrap();
    assert!(resolved.pin.is_none());
    assert_eq!(resolved.files.len(), 1);
    assert_eq!(resolved.files[0].path, "tiny-f32.gguf");
    let (size, digest) = common::digest::file_digest(&file, common::digest::Algorithm::Sha256).unwrap();
    assert_eq!((resolved.files[0].size, &resolved.files[0].digest), (size, &digest));
}

#[test]
fn native_weights_compute_on_a_quantized_files_blocks_close_to_their_f32_values() {
    use common::load::LoadedModel;
    use common::qwen::WeightDtype;
    let tmp = tempfile::tempdir().unwrap();
    for ty in [WeightType::Q8_0, WeightType::Q4_0, WeightType::Q4_1] {
        let file = tmp.path().join(format!("tiny-{ty:?}.gguf"));
        export(&support::tiny_dir(), &file, ty).unwrap();
        let native = LoadedModel::load_as(&file, WeightDtype::Native).unwrap();
        let widened = LoadedModel::load_as(&file, WeightDtype::F32).unwrap();
        assert!(native.model.weight_bytes() < widened.model.weight_bytes(), "{ty:?}: native holds the blocks");
        let (_, ids) = native.encode_user_prompt(PROMPT).unwrap();
        let logits = |m: &LoadedModel, ids: &[u32]| {
            let mut cache = m.model.new_cache(64).unwrap();
            m.model.forward(&mut cache, ids).unwrap().to_vec1::<f32>().unwrap()
        };
        let (a, b) = (logits(&native, &ids), logits(&widened, &ids));
        let scale = b.iter().fold(0f32, |m, v| m.max(v.abs()));
        let worst = a.iter().zip(&b).fold(0f32, |m, (a, b)| m.max((a - b).abs()));
        // Only the activations' rounding to 8-bit blocks differs.
        assert!(worst <= 0.1 * scale, "{ty:?}: logits off by {worst} of {scale}");
        // A prompt prefilled in two chunks gives the bits of one pass.
        let mut cache = native.model.new_cache(64).unwrap();
        native.model.forward(&mut cache, &ids[..5]).unwrap();
        let chunked = native.model.forward(&mut cache, &ids[5..]).unwrap().to_vec1::<f32>().unwrap();
        assert_eq!(chunked, a, "{ty:?}: chunked prefill");
    }
    let err = LoadedModel::load_as(&support::tiny_dir(), WeightDtype::Native).err().unwrap().to_string();
    assert!(err.contains("--dtype f32, f16 or bf16"), "{err}");
}
