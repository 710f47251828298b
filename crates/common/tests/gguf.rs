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
    for (ty, tolerance) in [(WeightType::F32, 0.0), (WeightType::F16, 2e-3), (WeightType::Q8_0, 2e-2)] {
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
                (WeightType::Q8_0, _) if original.dims()[1] % 32 == 0 => GgmlDType::Q8_0,
                (WeightType::Q8_0, _) => GgmlDType::F16,
            };
            assert_eq!(info.ggml_dtype, expected_type, "{name}");
            let back = content.tensor(&mut file, &name, &Device::Cpu).unwrap().dequantize(&Device::Cpu).unwrap();
            let original = original.to_dtype(DType::F32).unwrap();
            let scale = original.abs().unwrap().flatten_all().unwrap().max(0).unwrap().to_scalar::<f32>().unwrap();
            assert!(max_abs_diff(&back, &original) <= tolerance * scale.max(1.0), "{name} {ty:?}");
        }
        if ty == WeightType::Q8_0 {
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
