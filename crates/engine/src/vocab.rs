//! A GGUF file's tokenizer as llama.cpp reads it: the `gpt2` byte-level BPE of
//! `tokenizer.ggml.tokens` and `merges`, split first at the special tokens that `token_type`
//! names, then by the regular expressions of the pre-tokenizer `tokenizer.ggml.pre` names, each
//! expression run within the pieces the one before it left (what llama.cpp does, and why its
//! `smollm` split differs from transformers' converter: a lookahead at a piece's end sees the
//! end of the text). Built as a `tokenizers::Tokenizer`, so the loader, the chat encoding and
//! the server use it like a checkpoint's `tokenizer.json`; the tests hold its ids to llama.cpp's.

use tokenizers::decoders::byte_level::ByteLevel as ByteLevelDecoder;
use tokenizers::models::bpe::BPE;
use tokenizers::pre_tokenizers::byte_level::ByteLevel;
use tokenizers::pre_tokenizers::sequence::Sequence;
use tokenizers::pre_tokenizers::split::{Split, SplitPattern};
use tokenizers::pre_tokenizers::PreTokenizerWrapper;
use tokenizers::processors::template::TemplateProcessing;
use tokenizers::{AddedToken, SplitDelimiterBehavior, Tokenizer};

/// `token_type` values (llama.cpp's `LLAMA_TOKEN_TYPE_*`).
pub(crate) const UNKNOWN: i32 = 2;
pub(crate) const CONTROL: i32 = 3;
pub(crate) const USER_DEFINED: i32 = 4;

/// Llama 3's expression (llama.cpp's `llama-bpe`), with `DIGITS` standing for how many digits
/// make one piece; Qwen2 differs only there.
const LLAMA3: &str = r"(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\r\n\p{L}\p{N}]?\p{L}+|DIGITS| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";
/// GPT-2's expression, with llama.cpp's fallback for whitespace the lookahead leaves.
const GPT2: &str = r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+";

/// The expressions of a pre-tokenizer, in the order llama.cpp applies them.
fn expressions(pre: &str) -> Option<Vec<String>> {
    match pre {
        "llama-bpe" => Some(vec![LLAMA3.replace("DIGITS", r"\p{N}{1,3}")]),
        "qwen2" => Some(vec![LLAMA3.replace("DIGITS", r"\p{N}")]),
        "smollm" => Some(vec![r"\p{N}".to_string(), GPT2.to_string()]),
        _ => None,
    }
}

#[derive(Debug, thiserror::Error)]
pub enum VocabError {
    #[error("tokenizer `{0}` is not one this engine reads; it reads llama.cpp's `gpt2` BPE")]
    Model(String),
    #[error("pre-tokenizer `{0}` is not one this engine splits like llama.cpp; it splits qwen2, smollm and llama-bpe")]
    Pre(String),
    #[error("tokenizer.ggml.token_type has {types} entries for {tokens} tokens")]
    Types { tokens: usize, types: usize },
    #[error("tokenizer.ggml.merges entry {index} (`{merge}`) is not two tokens of the vocabulary joined by a space")]
    Merge { index: usize, merge: String },
    #[error("tokenizer.ggml.bos_token_id {0} is past the vocabulary")]
    Bos(u32),
    #[error("the tokenizer does not build: {0}")]
    Build(String),
}

/// What the tokenizer is made of, as the file holds it.
pub(crate) struct GgufVocab<'a> {
    pub(crate) model: &'a str,
    pub(crate) pre: &'a str,
    pub(crate) tokens: &'a [&'a str],
    pub(crate) types: &'a [i32],
    pub(crate) merges: &'a [&'a str],
    pub(crate) bos: Option<u32>,
    /// Whether encoding with special tokens puts the BOS id first.
    pub(crate) add_bos: bool,
}

/// The tokenizer llama.cpp would build from `v`.
pub(crate) fn from_gguf(v: &GgufVocab<'_>) -> Result<Tokenizer, VocabError> {
    if v.model != "gpt2" {
        return Err(VocabError::Model(v.model.to_string()));
    }
    let regexes = expressions(v.pre).ok_or_else(|| VocabError::Pre(v.pre.to_string()))?;
    if v.types.len() != v.tokens.len() {
        return Err(VocabError::Types { tokens: v.tokens.len(), types: v.types.len() });
    }
    let vocab: tokenizers::models::bpe::Vocab =
        v.tokens.iter().enumerate().map(|(id, t)| (t.to_string(), id as u32)).collect();
    // A merge is split at its first space after the first character (a token may be a space);
    // where a pair is listed twice, llama.cpp keeps its first rank.
    let mut seen = std::collections::HashSet::new();
    let mut merges = Vec::with_capacity(v.merges.len());
    for (index, merge) in v.merges.iter().enumerate() {
        let bad = || VocabError::Merge { index, merge: merge.to_string() };
        let first = merge.chars().next().ok_or_else(bad)?;
        let at = merge[first.len_utf8()..].find(' ').ok_or_else(bad)? + first.len_utf8();
        let (a, b) = (&merge[..at], &merge[at + 1..]);
        if !vocab.contains_key(a) || !vocab.contains_key(b) || !vocab.contains_key(&format!("{a}{b}")) {
            return Err(bad());
        }
        if seen.insert((a, b)) {
            merges.push((a.to_string(), b.to_string()));
        }
    }
    let bpe = BPE::builder()
        .vocab_and_merges(vocab, merges)
        .ignore_merges(v.pre == "llama-bpe")
        .build()
        .map_err(|e| VocabError::Build(e.to_string()))?;
    let mut pieces: Vec<PreTokenizerWrapper> = Vec::with_capacity(regexes.len() + 1);
    for r in regexes {
        let split = Split::new(SplitPattern::Regex(r), SplitDelimiterBehavior::Isolated, false)
            .map_err(|e| VocabError::Build(e.to_string()))?;
        pieces.push(split.into());
    }
    pieces.push(ByteLevel::new(false, false, false).into());
    let mut tokenizer = Tokenizer::new(bpe);
    tokenizer.with_pre_tokenizer(Some(Sequence::new(pieces)));
    tokenizer.with_decoder(Some(ByteLevelDecoder::new(false, false, false)));
    // Control and unknown tokens are special (read as text when a caller asks for that, as
    // llama.cpp's `parse_special = false`); user-defined ones are always split out.
    let added = |types: &[i32], special: bool| -> Vec<AddedToken> {
        v.tokens
            .iter()
            .zip(v.types)
            .filter(|(_, t)| types.contains(t))
            .map(|(text, _)| AddedToken::from(text.to_string(), special).normalized(false))
            .collect()
    };
    tokenizer.add_special_tokens(&added(&[CONTROL, UNKNOWN], true));
    tokenizer.add_tokens(&added(&[USER_DEFINED], false));
    if let (true, Some(bos)) = (v.add_bos, v.bos) {
        let text = v.tokens.get(bos as usize).ok_or(VocabError::Bos(bos))?.to_string();
        let post = TemplateProcessing::builder()
            .try_single(format!("{text} $A"))
            .and_then(|b| b.try_pair(format!("{text} $A $B")))
            .map_err(VocabError::Build)?
            .special_tokens(vec![(text, bos)])
            .build()
            .map_err(|e| VocabError::Build(e.to_string()))?;
        tokenizer.with_post_processor(Some(post));
    }
    Ok(tokenizer)
}
