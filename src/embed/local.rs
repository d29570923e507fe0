//! The `local` provider: a static embedding model, read from disk and run in process.
//!
//! The model2vec layout: `tokenizer.json` (a Hugging Face tokenizer) and `model.safetensors`
//! holding one 2-D matrix, a row per token id. A text's vector is the mean of the rows of its
//! tokens (special tokens not added, unknown tokens skipped), scaled to unit length. That is
//! all the model does, so it embeds thousands of chunks per second on one core and never
//! touches the network.

use std::cell::RefCell;
use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};

use tokenizers::{Model, Normalizer};

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
    /// Whether texts may be tokenized piece by piece (see [`StaticModel::pieces_agree`]).
    by_piece: bool,
    /// Tells this model's entries in the per-thread piece caches from another model's.
    serial: usize,
    /// The texts of the tokenizer's added tokens (`<s>`, `<unk>`): the tokenizer finds them
    /// anywhere in a text, so a text holding one takes the tokenizer's own path.
    added: Vec<String>,
}

/// Distinct pieces one thread remembers the tokens of; the cache is emptied when full. Only
/// pieces up to [`CACHED_PIECE`] bytes are kept (words, not a query of unbroken text), so a
/// thread's cache stays under about 5 MB.
const PIECE_CACHE: usize = 50_000;
const CACHED_PIECE: usize = 48;

/// Numbers each model loaded, for the per-thread caches.
// Static: a model number: serials must be unique across the models of every application in the process.
static SERIAL: AtomicUsize = AtomicUsize::new(0);

// Static: per thread, a token cache keyed by a process-unique model serial: another model finds it empty.
thread_local! {
    /// Tokens of recently seen pieces, per model: most words of a corpus recur, and BPE work
    /// on a word is what tokenizing costs.
    static PIECES: RefCell<(usize, HashMap<String, Vec<u32>>)> = RefCell::new((usize::MAX, HashMap::new()));
}

/// Texts the piece-by-piece path must tokenize exactly as the tokenizer does before it is
/// used: spaces, tabs, newlines, runs, punctuation, digits, code, accents, CJK, emoji.
const PROBES: &[&str] = &[
    "How do I roll back a release?",
    "  leading and trailing  spaces  ",
    "tabs\tand\nnewlines\r\n  mixed \u{a0}non-breaking",
    "fn main() { println!(\"{}\", x[0] + 42); } // code_with_under_scores",
    "Ünïcödé naïve café – “quotes” and ‘apostrophes’",
    "日本語のテキストと中文文本",
    "emoji 🚀🔥 and symbols ±§¶ 3.14159 1,000,000",
    "",
    " ",
    "a",
    "UPPER lower MiXeD kebab-case snake_case CamelCase",
];

/// The model `[embedding] path` names: a transformer when the folder holds one (see
/// [`super::transformer`]), else a static model.
pub fn from_config(config: &Config) -> Result<std::sync::Arc<dyn Embedder>, EmbedError> {
    let (dir, shown, name, dims) = model_folder(config)?;
    if super::transformer::TransformerModel::is_in(&dir) {
        return Ok(std::sync::Arc::new(super::transformer::TransformerModel::load(&dir, &shown, &name, dims)?));
    }
    Ok(std::sync::Arc::new(StaticModel::read(&dir, &shown, &name, dims)?))
}

/// The model in `dir` (a transformer or a static one), named `local:<name>`: what a config
/// naming that folder loads, for tools and benches that have no config.
pub fn load(dir: &Path, name: &str) -> Result<std::sync::Arc<dyn Embedder>, EmbedError> {
    if super::transformer::TransformerModel::is_in(dir) {
        return Ok(std::sync::Arc::new(super::transformer::TransformerModel::load(dir, dir, name, None)?));
    }
    Ok(std::sync::Arc::new(StaticModel::read(dir, dir, name, None)?))
}

/// The model folder `[embedding] path` names (resolved, and as the config says it), the model's
/// name and the dims asked for.
fn model_folder(config: &Config) -> Result<(PathBuf, PathBuf, String, Option<usize>), EmbedError> {
    let spec = &config.spec.embedding;
    let Some(path) = spec.path.as_deref() else {
        return Err(EmbedError::Config(
            "provider \"local\" needs `path`, the folder holding tokenizer.json and model.safetensors \
             (scripts/get-model installs one in ~/.local/share/ctx/models/wordllama-l2-256)"
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
    // Messages name the path as the config does: they can reach API clients, which have no
    // business knowing the server's folders.
    Ok((dir, PathBuf::from(path), name, spec.dims.map(|d| d as usize)))
}

impl StaticModel {
    /// Reads `dir/tokenizer.json` and `dir/model.safetensors`.
    pub fn load(dir: &Path, name: &str, dims: Option<usize>) -> Result<Self, EmbedError> {
        Self::read(dir, dir, name, dims)
    }

    /// [`StaticModel::load`], naming the files under `shown` in errors.
    fn read(dir: &Path, shown: &Path, name: &str, dims: Option<usize>) -> Result<Self, EmbedError> {
        let fail = |path: &Path, message: String| {
            let path = path.strip_prefix(dir).map(|rel| shown.join(rel)).unwrap_or_else(|_| shown.to_path_buf());
            EmbedError::Load { path: path.display().to_string(), message }
        };
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
        let serial = SERIAL.fetch_add(1, Ordering::Relaxed);
        let added = tokenizer
            .get_added_tokens_decoder()
            .values()
            .map(|t| t.content.clone())
            .filter(|c| !c.is_empty())
            .collect();
        let mut model = StaticModel {
            name: format!("local:{name}"),
            tokenizer,
            matrix,
            rows,
            dims,
            unknown,
            by_piece: false,
            serial,
            added,
        };
        model.by_piece = model.pieces_agree();
        Ok(model)
    }

    /// Whether tokenizing piece by piece gives the tokenizer's own ids. It does for the
    /// SentencePiece style of tokenizer (wordllama's: Llama 2's BPE, whose normalizer turns
    /// spaces into `▁` and which has no pre-tokenizer, so a whole text is one BPE "word"):
    /// no token of its vocabulary has `▁` after another character, so no merge crosses the
    /// start of a word, and each word can be tokenized alone and remembered. That is several
    /// times faster. Checked on the vocabulary and on [`PROBES`]; any other tokenizer is run
    /// as it is.
    fn pieces_agree(&self) -> bool {
        if self.tokenizer.get_pre_tokenizer().is_some() || self.tokenizer.get_normalizer().is_none() {
            return false;
        }
        let crosses = self.tokenizer.get_vocab(true).keys().any(|t| t.trim_start_matches('▁').contains('▁'));
        if crosses {
            return false;
        }
        PROBES.iter().all(|text| {
            let whole = self.reference_ids_opt(text);
            whole.is_some() && whole == self.piece_ids(text)
        }) && self.added.iter().all(|token| {
            let text = format!("before {token} after");
            self.reference_ids_opt(&text) == Some(self.token_ids(&text))
        })
    }

    /// The ids of `text`, a normalised piece at a time: each piece is a run of `▁` followed by
    /// anything else, or a trailing run of `▁`.
    fn piece_ids(&self, text: &str) -> Option<Vec<u32>> {
        let normalizer = self.tokenizer.get_normalizer()?;
        let mut normalized = tokenizers::NormalizedString::from(text);
        normalizer.normalize(&mut normalized).ok()?;
        let normalized = normalized.get();
        let mut ids = Vec::with_capacity(normalized.len() / 3);
        PIECES.with(|cache| {
            let mut cache = cache.borrow_mut();
            if cache.0 != self.serial || cache.1.len() >= PIECE_CACHE {
                *cache = (self.serial, HashMap::new());
            }
            for piece in pieces(normalized) {
                if let Some(known) = cache.1.get(piece) {
                    ids.extend_from_slice(known);
                    continue;
                }
                let tokens: Vec<u32> = self.tokenizer.get_model().tokenize(piece).ok()?.iter().map(|t| t.id).collect();
                ids.extend_from_slice(&tokens);
                if piece.len() <= CACHED_PIECE {
                    cache.1.insert(piece.to_string(), tokens);
                }
            }
            Some(())
        })?;
        Some(ids)
    }

    /// Whether texts are tokenized piece by piece (see [`StaticModel::pieces_agree`]).
    pub fn tokenizes_by_piece(&self) -> bool {
        self.by_piece
    }

    /// The token ids a text is embedded from.
    pub fn token_ids(&self, text: &str) -> Vec<u32> {
        let by_piece = self.by_piece && !self.added.iter().any(|t| text.contains(t.as_str()));
        let ids = if by_piece { self.piece_ids(text) } else { self.reference_ids_opt(text) };
        ids.unwrap_or_default()
    }

    /// The tokenizer's own ids for a text (special tokens not added).
    pub fn reference_ids(&self, text: &str) -> Vec<u32> {
        self.reference_ids_opt(text).unwrap_or_default()
    }

    fn reference_ids_opt(&self, text: &str) -> Option<Vec<u32>> {
        self.tokenizer.encode_fast(text, false).ok().map(|e| e.get_ids().to_vec())
    }

    /// The unit vector of one text.
    pub fn embed_one(&self, text: &str) -> Vec<f32> {
        let mut sum = vec![0.0f32; self.dims];
        let ids = self.token_ids(text);
        let mut counted = 0usize;
        for &id in ids.iter().take(MAX_TOKENS) {
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
    if let Some(at) = values.iter().position(|v| !v.is_finite()) {
        return Err(format!("tensor {name} holds a value that is not a finite number (row {})", at / columns.max(1)));
    }
    Ok((values, rows, columns))
}

/// `text` cut before each `▁` that follows another character: `▁the▁cat` → `▁the`, `▁cat`.
fn pieces(text: &str) -> impl Iterator<Item = &str> {
    let mut rest = text;
    std::iter::from_fn(move || {
        if rest.is_empty() {
            return None;
        }
        let lead = rest.len() - rest.trim_start_matches('▁').len();
        let end = rest[lead..].find('▁').map_or(rest.len(), |i| lead + i);
        let (piece, tail) = rest.split_at(end);
        rest = tail;
        Some(piece)
    })
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

/// Where `ctx init` looks for the default model: `$CTX_MODEL_DIR` alone when it is set (where
/// `scripts/get-model` put it), else `models/<name>` beside the config, then the user's data
/// folder (`scripts/get-model`'s default).
pub fn default_model_dirs(base: &Path) -> Vec<PathBuf> {
    if let Some(dir) = std::env::var_os("CTX_MODEL_DIR") {
        return vec![PathBuf::from(dir)];
    }
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
    fn pieces_split_before_each_word_marker() {
        fn split(t: &str) -> Vec<&str> {
            pieces(t).collect()
        }
        assert_eq!(split("▁the▁cat"), vec!["▁the", "▁cat"]);
        assert_eq!(split("▁▁two▁▁"), vec!["▁▁two", "▁▁"]);
        assert_eq!(split("no▁marker▁first"), vec!["no", "▁marker", "▁first"]);
        assert_eq!(split(""), Vec::<&str>::new());
        assert_eq!(split("▁日本▁語"), vec!["▁日本", "▁語"]);
    }

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
