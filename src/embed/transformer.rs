//! The `local` provider's transformer models: a BERT-family sentence encoder (all-MiniLM-L6-v2
//! and its kin, in the sentence-transformers layout) run in process with candle, in pure Rust.
//!
//! The folder holds `config.json` (a BERT config), `tokenizer.json` and `model.safetensors`, and
//! optionally `sentence_bert_config.json` (`max_seq_length`). A text's vector is the mean of its
//! tokens' last hidden states (padding masked out), scaled to unit length: what the
//! sentence-transformers pooling of these models does. A text longer than `max_seq_length`
//! tokens is cut there (256 for all-MiniLM-L6-v2), as the model was trained.
//!
//! It is far slower than the static model (a forward pass through six attention layers per
//! token instead of a table lookup): about ten chunks a second per core at 200 tokens. Pair it
//! with `[embedding] background = true`, so that sync stays fast.

use std::path::Path;

use candle_core::{DType, Device, Tensor};
use candle_nn::VarBuilder;
use candle_transformers::models::bert::{BertModel, Config as BertConfig};

use super::{normalize, EmbedError, Embedder};

/// Texts per forward pass: large enough to keep the matrix products busy, small enough that
/// padding to the longest text of a batch wastes little.
const BATCH: usize = 16;
/// `max_seq_length` when the folder does not say.
const DEFAULT_MAX_TOKENS: usize = 256;

pub struct TransformerModel {
    name: String,
    model: BertModel,
    tokenizer: tokenizers::Tokenizer,
    dims: usize,
    device: Device,
}

impl TransformerModel {
    /// Whether `dir` holds a transformer model (a `config.json` naming a BERT-family
    /// `model_type`) rather than a static one.
    pub fn is_in(dir: &Path) -> bool {
        std::fs::read_to_string(dir.join("config.json"))
            .ok()
            .and_then(|text| serde_json::from_str::<serde_json::Value>(&text).ok())
            .and_then(|config| config.get("model_type").and_then(|t| t.as_str()).map(str::to_string))
            .is_some_and(|t| matches!(t.as_str(), "bert" | "roberta" | "xlm-roberta" | "distilbert" | "mpnet"))
    }

    /// Reads the model in `dir`; errors name files under `shown` (the path as the config says it).
    pub fn load(dir: &Path, shown: &Path, name: &str, dims: Option<usize>) -> Result<Self, EmbedError> {
        let fail =
            |file: &str, message: String| EmbedError::Load { path: shown.join(file).display().to_string(), message };
        let text = std::fs::read_to_string(dir.join("config.json")).map_err(|e| fail("config.json", e.to_string()))?;
        let config: BertConfig = serde_json::from_str(&text).map_err(|e| {
            fail("config.json", format!("not a BERT config this version of ctx can run ({e}); the static models and BERT-family sentence encoders are supported"))
        })?;
        let max_tokens = std::fs::read_to_string(dir.join("sentence_bert_config.json"))
            .ok()
            .and_then(|text| serde_json::from_str::<serde_json::Value>(&text).ok())
            .and_then(|c| c.get("max_seq_length").and_then(|n| n.as_u64()))
            .map_or(DEFAULT_MAX_TOKENS, |n| n as usize)
            .min(config.max_position_embeddings);
        let mut tokenizer = tokenizers::Tokenizer::from_file(dir.join("tokenizer.json"))
            .map_err(|e| fail("tokenizer.json", e.to_string()))?;
        tokenizer
            .with_truncation(Some(tokenizers::TruncationParams { max_length: max_tokens, ..Default::default() }))
            .map_err(|e| fail("tokenizer.json", e.to_string()))?;
        tokenizer.with_padding(Some(tokenizers::PaddingParams {
            strategy: tokenizers::PaddingStrategy::BatchLongest,
            ..Default::default()
        }));
        let device = Device::Cpu;
        let weights = dir.join("model.safetensors");
        if !weights.exists() {
            return Err(fail("model.safetensors", "no such file".to_string()));
        }
        // Mapped, not read: the pages are the file's, shared with the page cache.
        // SAFETY: the file is not modified while ctx runs (a model folder is installed once);
        // candle reads the mapping as plain bytes.
        let vb = unsafe { VarBuilder::from_mmaped_safetensors(&[&weights], DType::F32, &device) }
            .map_err(|e| fail("model.safetensors", e.to_string()))?;
        let model = BertModel::load(vb, &config).map_err(|e| fail("model.safetensors", e.to_string()))?;
        let width = config.hidden_size;
        let dims = dims.unwrap_or(width);
        if dims > width {
            return Err(EmbedError::Config(format!(
                "dims = {dims}, but the model has {width} dimensions; lower dims or remove it"
            )));
        }
        Ok(TransformerModel { name: format!("local:{name}"), model, tokenizer, dims, device })
    }

    fn batch(&self, texts: &[&str]) -> Result<Vec<Vec<f32>>, String> {
        let encodings = self.tokenizer.encode_batch(texts.to_vec(), true).map_err(|e| e.to_string())?;
        let ids: Vec<Tensor> = encodings
            .iter()
            .map(|e| Tensor::new(e.get_ids(), &self.device))
            .collect::<Result<_, _>>()
            .map_err(|e| e.to_string())?;
        let masks: Vec<Tensor> = encodings
            .iter()
            .map(|e| Tensor::new(e.get_attention_mask(), &self.device))
            .collect::<Result<_, _>>()
            .map_err(|e| e.to_string())?;
        let run = || -> candle_core::Result<Vec<Vec<f32>>> {
            let ids = Tensor::stack(&ids, 0)?;
            let mask = Tensor::stack(&masks, 0)?;
            let types = ids.zeros_like()?;
            let hidden = self.model.forward(&ids, &types, Some(&mask))?;
            // Mean over the real tokens: padding contributes nothing and is not counted.
            let mask = mask.to_dtype(DType::F32)?.unsqueeze(2)?;
            let summed = hidden.broadcast_mul(&mask)?.sum(1)?;
            let counts = mask.sum(1)?.clamp(1e-9, f64::MAX)?;
            summed.broadcast_div(&counts)?.to_vec2::<f32>()
        };
        let mut vectors = run().map_err(|e| e.to_string())?;
        for v in &mut vectors {
            v.truncate(self.dims);
            normalize(v);
        }
        Ok(vectors)
    }
}

impl Embedder for TransformerModel {
    fn name(&self) -> &str {
        &self.name
    }

    fn dims(&self) -> usize {
        self.dims
    }

    fn embed(&self, texts: &[&str]) -> Result<Vec<Vec<f32>>, EmbedError> {
        // Texts of like length share a batch, so little is padded; the answer keeps their order.
        let mut order: Vec<usize> = (0..texts.len()).collect();
        order.sort_by_key(|&i| texts[i].len());
        let mut out = vec![Vec::new(); texts.len()];
        for group in order.chunks(BATCH) {
            let batch: Vec<&str> = group.iter().map(|&i| texts[i]).collect();
            let vectors =
                self.batch(&batch).map_err(|message| EmbedError::Provider { provider: self.name.clone(), message })?;
            for (&i, v) in group.iter().zip(vectors) {
                out[i] = v;
            }
        }
        Ok(out)
    }

    fn remote(&self) -> bool {
        false
    }

    fn parallel_inside(&self) -> bool {
        true
    }

    /// About ten chunks a second on two cores: a sync that waited for it would take minutes
    /// where keyword indexing takes a second.
    fn background_by_default(&self) -> bool {
        true
    }

    /// Chosen on the Debian quality set with all-MiniLM-L6-v2 at rrf_k 2 (nDCG@10 0.9186 at 0.4,
    /// 0.9179 at 0.5, 0.9115 at 0.3); the held-out man pages, only reported: 0.7191 at 0.4
    /// against 0.7051 at 0.3 and keyword's 0.6774.
    fn hybrid_weight(&self) -> f64 {
        0.4
    }
}
