//! The `local` provider: a static embedding model, read from disk and run in process.
//!
//! The model2vec layout: `tokenizer.json` (a Hugging Face tokenizer) and `model.safetensors`
//! holding one 2-D matrix, a row per token id. A text's vector is the mean of the rows of its
//! tokens (special tokens not added, unknown tokens skipped), scaled to unit length. That is
//! all the model does, so it embeds thousands of chunks per second on one core and never
//! touches the network.

use std::path::{Path, PathBuf};

use super::{normalize, EmbedError, Embedder};
use crate::config::Config;

/// Tokens of one text that count: enough for any chunk, and a bound on one call's work.
const MAX_TOKENS: usize = 8192;

/// A static embedding model in memory.
pub struct StaticModel {
    name: String,
    tokenizer: tokenizers::Tokenizer,
    /// `rows × dims`, row-major, F32.
    matrix: Vec<f32>,
    rows: usize,
    dims: usize,
    unknown: Option<u32>,
}

impl StaticModel {
    /// The model `[embedding] path` names, cut to `dims` columns when that is set lower.
    pub fn from_config(config: &Config) -> Result<Self, EmbedError> {
        let spec = &config.spec.embedding;
        let Some(path) = spec.path.as_deref() else {
            return Err(EmbedError::Config(
                "provider \"local\" needs `path`, the folder holding tokenizer.json and model.safetensors \
                 (scripts/quickstart downloads one to models/wordllama-l2-256)"
                    .to_string(),
            ));
        };
        let dir = match path.strip_prefix("~/") {
            Some(rest) => std::env::var_os("HOME").map(PathBuf::from).unwrap_or_default().join(rest),
            None => config.resolve(path),
        };
        let name = spec.model.as_ref().map(|m| m.to_string()).unwrap_or_else(|| {
            dir.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_else(|| "model".to_string())
        });
        Self::load(&dir, &name, spec.dims.map(|d| d as usize))
    }

    /// Reads `dir/tokenizer.json` and `dir/model.safetensors`.
    pub fn load(dir: &Path, name: &str, dims: Option<usize>) -> Result<Self, EmbedError> {
        let fail = |path: &Path, message: String| EmbedError::Load { path: path.display().to_string(), message };
        let tokenizer_path = dir.join("tokenizer.json");
        let tokenizer = tokenizers::Tokenizer::from_file(&tokenizer_path).map_err(|e| {
            fail(&tokenizer_path, if tokenizer_path.exists() { e.to_string() } else { "no such file".to_string() })
        })?;
        let weights_path = dir.join("model.safetensors");
        let bytes = std::fs::read(&weights_path).map_err(|e| fail(&weights_path, e.to_string()))?;
        let (matrix, rows, columns) = read_matrix(&bytes).map_err(|m| fail(&weights_path, m))?;
        Self::new(name, tokenizer, matrix, rows, columns, dims).map_err(|m| fail(dir, m))
    }

    /// A model from parts (tests build tiny ones in code).
    pub fn new(
        name: &str,
        tokenizer: tokenizers::Tokenizer,
        matrix: Vec<f32>,
        rows: usize,
        columns: usize,
        dims: Option<usize>,
    ) -> Result<Self, String> {
        if rows == 0 || columns == 0 || matrix.len() != rows * columns {
            return Err(format!("the embedding matrix is {rows} × {columns} but holds {} values", matrix.len()));
        }
        let dims = dims.unwrap_or(columns);
        if dims > columns {
            return Err(format!(
                "[embedding] dims = {dims}, but the model has {columns} dimensions; lower dims or remove it"
            ));
        }
        let vocab = tokenizer.get_vocab_size(true);
        if vocab > rows {
            return Err(format!(
                "the tokenizer has {vocab} tokens but the matrix only {rows} rows: they are not one model"
            ));
        }
        // Matryoshka models keep the first columns: drop the rest once, here.
        let matrix = if dims == columns {
            matrix
        } else {
            matrix.chunks_exact(columns).flat_map(|row| row[..dims].iter().copied()).collect()
        };
        let unknown = ["<unk>", "[UNK]", "<UNK>"].iter().find_map(|t| tokenizer.token_to_id(t));
        Ok(StaticModel { name: format!("local:{name}"), tokenizer, matrix, rows, dims, unknown })
    }

    /// The unit vector of one text.
    pub fn embed_one(&self, text: &str) -> Vec<f32> {
        let mut sum = vec![0.0f32; self.dims];
        let Ok(encoding) = self.tokenizer.encode_fast(text, false) else { return sum };
        let mut counted = 0usize;
        for &id in encoding.get_ids().iter().take(MAX_TOKENS) {
            let id = id as usize;
            if Some(id as u32) == self.unknown || id >= self.rows {
                continue;
            }
            let row = &self.matrix[id * self.dims..(id + 1) * self.dims];
            sum.iter_mut().zip(row).for_each(|(s, r)| *s += r);
            counted += 1;
        }
        // The mean's direction is the sum's: normalising is all that is left.
        if counted > 0 {
            normalize(&mut sum);
        }
        sum
    }
}

impl Embedder for StaticModel {
    fn name(&self) -> &str {
        &self.name
    }

    fn dims(&self) -> usize {
        self.dims
    }

    fn embed(&self, texts: &[&str]) -> Result<Vec<Vec<f32>>, EmbedError> {
        Ok(texts.iter().map(|t| self.embed_one(t)).collect())
    }

    fn remote(&self) -> bool {
        false
    }
}

/// The one 2-D tensor of a safetensors file, as F32: `(values, rows, columns)`. The format is
/// an 8-byte little-endian header length, a JSON header naming each tensor's dtype, shape and
/// byte range, then the data.
pub fn read_matrix(bytes: &[u8]) -> Result<(Vec<f32>, usize, usize), String> {
    let bad = |what: &str| format!("not a safetensors file: {what}");
    let len = bytes.get(..8).ok_or_else(|| bad("shorter than its header"))?;
    let len = u64::from_le_bytes(len.try_into().unwrap_or_default()) as usize;
    let header = bytes.get(8..8usize.saturating_add(len)).ok_or_else(|| bad("the header runs past the end"))?;
    let header: serde_json::Map<String, serde_json::Value> =
        serde_json::from_slice(header).map_err(|e| bad(&format!("its header is not JSON ({e})")))?;
    let data = &bytes[8 + len..];
    let matrices: Vec<(&String, &serde_json::Value)> = header
        .iter()
        .filter(|(name, t)| *name != "__metadata__" && t["shape"].as_array().is_some_and(|s| s.len() == 2))
        .collect();
    // model2vec names it `embeddings`, wordllama `embedding.weight`; any lone matrix will do.
    let (name, tensor) = match matrices.as_slice() {
        [one] => *one,
        [] => return Err("it holds no 2-D tensor (expected the embedding matrix)".to_string()),
        many => many
            .iter()
            .find(|(n, _)| n.as_str() == "embeddings" || n.ends_with("embedding.weight"))
            .copied()
            .ok_or_else(|| format!("it holds {} matrices and none is named embeddings", many.len()))?,
    };
    let dim = |i: usize| tensor["shape"][i].as_u64().map(|d| d as usize).ok_or_else(|| bad("a shape is not a number"));
    let (rows, columns) = (dim(0)?, dim(1)?);
    let offsets = tensor["data_offsets"].as_array().ok_or_else(|| bad("a tensor has no data_offsets"))?;
    let (start, end) = match offsets.as_slice() {
        [s, e] => (s.as_u64().unwrap_or(u64::MAX) as usize, e.as_u64().unwrap_or(0) as usize),
        _ => return Err(bad("data_offsets is not [start, end]")),
    };
    let raw = data.get(start..end).filter(|_| start <= end).ok_or_else(|| bad("a tensor's data runs past the end"))?;
    let values: Vec<f32> = match tensor["dtype"].as_str() {
        Some("F32") => raw.chunks_exact(4).map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]])).collect(),
        Some("F16") => raw.chunks_exact(2).map(|b| f16_to_f32(u16::from_le_bytes([b[0], b[1]]))).collect(),
        Some("BF16") => {
            raw.chunks_exact(2).map(|b| f32::from_bits((u16::from_le_bytes([b[0], b[1]]) as u32) << 16)).collect()
        }
        other => return Err(format!("tensor {name} is {}; F32, F16 and BF16 are supported", other.unwrap_or("?"))),
    };
    if values.len() != rows.saturating_mul(columns) {
        return Err(format!("tensor {name} is {rows} × {columns} but holds {} values", values.len()));
    }
    Ok((values, rows, columns))
}

/// IEEE 754 half precision to single.
fn f16_to_f32(h: u16) -> f32 {
    let sign = ((h >> 15) as u32) << 31;
    let exponent = ((h >> 10) & 0x1f) as u32;
    let mantissa = (h & 0x3ff) as u32;
    let bits = match (exponent, mantissa) {
        (0, 0) => sign,
        // Subnormal: value = mantissa × 2^-24.
        (0, m) => return f32::from_bits(sign) + (m as f32) * f32::powi(2.0, -24) * if sign != 0 { -1.0 } else { 1.0 },
        (0x1f, 0) => sign | 0x7f80_0000,
        (0x1f, m) => sign | 0x7f80_0000 | (m << 13),
        (e, m) => sign | ((e + 127 - 15) << 23) | (m << 13),
    };
    f32::from_bits(bits)
}

/// Where `ctx init --sample` and the quickstart look for the default model: `models/<name>`
/// beside the config, else the user's data folder.
pub fn default_model_dirs(base: &Path) -> Vec<PathBuf> {
    let mut dirs = vec![base.join("models").join(DEFAULT_MODEL)];
    if let Some(data) = std::env::var_os("XDG_DATA_HOME")
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".local").join("share")))
    {
        dirs.push(data.join("ctx").join("models").join(DEFAULT_MODEL));
    }
    dirs
}

/// The folder name of the model the project's setup installs.
pub const DEFAULT_MODEL: &str = "wordllama-l2-256";

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn half_precision_converts_exactly() {
        assert_eq!(f16_to_f32(0x3c00), 1.0);
        assert_eq!(f16_to_f32(0xc000), -2.0);
        assert_eq!(f16_to_f32(0x3555), 0.333_251_95);
        assert_eq!(f16_to_f32(0x0001), 5.960_464_5e-8);
        assert_eq!(f16_to_f32(0x8000).to_bits(), (-0.0f32).to_bits());
        assert!(f16_to_f32(0x7c00).is_infinite());
    }

    #[test]
    fn safetensors_matrix_is_read_and_checked() {
        let header = br#"{"embeddings":{"dtype":"F16","shape":[2,2],"data_offsets":[0,8]}}"#;
        let mut file = (header.len() as u64).to_le_bytes().to_vec();
        file.extend_from_slice(header);
        for h in [0x3c00u16, 0x4000, 0xc000, 0x0000] {
            file.extend_from_slice(&h.to_le_bytes());
        }
        assert_eq!(read_matrix(&file).unwrap(), (vec![1.0, 2.0, -2.0, 0.0], 2, 2));
        assert!(read_matrix(&file[..20]).unwrap_err().contains("header runs past the end"));
        assert!(read_matrix(&file[..file.len() - 2]).unwrap_err().contains("runs past the end"));
        assert!(read_matrix(b"12").unwrap_err().contains("shorter than its header"));
    }
}
