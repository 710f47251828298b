//! What the client sends: the seed's three prompts, or a file of prompts (`--prompts FILE.jsonl`,
//! one `{"prompt": ...}` or `{"messages": [...]}` per line with an optional `max_tokens`), or a
//! ShareGPT export (`--sharegpt FILE.json`, each conversation's first human turn), or synthetic
//! prompts whose input and output lengths in tokens are drawn from named distributions
//! (`--input-tokens`, `--output-tokens`), or groups of chat requests that share a system prompt
//! (`--shared-prefix`), both counted with the model's tokenizer. The artifact
//! records the workload's digest and its length statistics, so two runs say whether they sent
//! the same requests.

use crate::record::WorkloadRecord;
use serde_json::Value;
use std::collections::BTreeMap;
use std::path::Path;

mod shape;
pub use shape::{
    Lengths, LengthsError, MultiTurn, MultiTurnError, SharedPrefix, SharedPrefixError, MAX_GENERATED_TOKENS,
    MAX_SYNTHETIC_TOKENS, MAX_TURNS,
};

/// One request's content, or a conversation's.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct Item {
    /// Its name in the records (`short`, `line-12`, `conversation-3`).
    pub name: String,
    /// The text (the only content for `/v1/completions`; for chat, one user message).
    pub prompt: String,
    /// A whole conversation for chat endpoints, when the file gives one.
    pub messages: Option<Value>,
    /// Its own cap on generated tokens, when the file gives one.
    pub max_tokens: Option<usize>,
    /// A multi-turn conversation's later user turns, each sent after the server's reply to the
    /// one before ([`crate::client::converse`]); empty for a single request.
    pub follow_ups: Vec<String>,
}

impl Item {
    /// The requests it makes: its turns.
    pub fn turns(&self) -> usize {
        1 + self.follow_ups.len()
    }
}

/// The items to send in turn, and the record of where they came from.
#[derive(Debug, Clone)]
pub struct Workload {
    pub items: Vec<Item>,
    pub record: WorkloadRecord,
}

impl Workload {
    /// Whether its items are conversations, sent turn by turn with each turn numbered: when any
    /// item has a later turn (the record then counts every item's turns).
    pub fn is_conversational(&self) -> bool {
        conversational(&self.items)
    }
}

fn conversational(items: &[Item]) -> bool {
    items.iter().any(|i| !i.follow_ups.is_empty())
}

/// What a `--prompts` file holds, for its errors.
const JSONL_LINE: &str = r#"each line is {"prompt": TEXT} or {"messages": [...]}, with an optional "max_tokens""#;
/// What a ShareGPT export holds, for its errors.
const SHAREGPT_SHAPE: &str = r#"a ShareGPT file is a JSON array of {"conversations": [{"from": "human", "value": TEXT}, ...]} ("user" and "assistant" read as "human" and "gpt"; "system" gives a system prompt)"#;
/// What a `--conversations` file holds, for its errors.
const CONVERSATIONS_SHAPE: &str = r#"a conversations file has one {"turns": [TEXT, ...]} per line, with an optional "system" and "max_tokens", or is a ShareGPT JSON array of {"conversations": [{"from": "human", "value": TEXT}, ...]} ("user" reads as "human")"#;

/// Why a workload file was refused.
#[derive(Debug, thiserror::Error)]
pub enum WorkloadError {
    #[error("{path}: {cause}")]
    Read { path: String, cause: std::io::Error },
    #[error("{path}:{line}: {problem}; {JSONL_LINE}")]
    Line { path: String, line: usize, problem: String },
    #[error("{path}: {problem}; {SHAREGPT_SHAPE}")]
    ShareGpt { path: String, problem: String },
    #[error("{path}:{line}: {problem}; {CONVERSATIONS_SHAPE}")]
    Conversation { path: String, line: usize, problem: String },
    #[error("{path}: no prompts in it; {expected}")]
    Empty { path: String, expected: &'static str },
    #[error("{what}: {tokens} tokens of text to generate, more than the {max} a workload may draw; give fewer or shorter prompts", max = MAX_GENERATED_TOKENS)]
    TooLarge { what: String, tokens: u128 },
    #[error("{path}: {cause}; give --tokenizer DIR, a folder holding the target model's tokenizer.json")]
    Tokenizer { path: String, cause: String },
}

/// The generated workload that `record` describes, drawn again from `seed` with the tokenizer in
/// `tokenizer_dir` (the shape read back from the record's `lengths`); `None` for prompts read
/// from a file or built in. What the audit compares with what was recorded.
pub fn redraw(record: &WorkloadRecord, seed: u64, tokenizer_dir: &Path) -> Option<Result<Workload, String>> {
    let shown = record.path.as_deref().unwrap_or_default();
    let lengths = record.lengths.as_deref().unwrap_or_default();
    let unreadable = || Err(format!("`{lengths}` names no {} shape", record.source));
    // A shape as given on the command line, before its description in words.
    let shape = lengths.split(' ').next().unwrap_or_default();
    let drawn = match record.source.as_str() {
        "shared-prefix" => match SharedPrefix::parse(shape) {
            Ok(shape) => Workload::shared_prefix(tokenizer_dir, shown, shape, seed),
            Err(_) => return Some(unreadable()),
        },
        "multi-turn" => match MultiTurn::parse(shape) {
            Ok(shape) => Workload::multi_turn(tokenizer_dir, shown, shape, seed),
            Err(_) => return Some(unreadable()),
        },
        "synthetic" => {
            let parts = lengths.strip_prefix("input ").and_then(|l| l.split_once(", output "));
            match parts.map(|(i, o)| (Lengths::parse(i), Lengths::parse(o))) {
                Some((Ok(input), Ok(output))) => {
                    Workload::synthetic(tokenizer_dir, shown, input, output, record.items, seed)
                }
                _ => return Some(unreadable()),
            }
        }
        _ => return None,
    };
    Some(drawn.map_err(|e| e.to_string()))
}

/// A line's own `max_tokens`, when it gives one.
fn max_tokens_of(line: &Value) -> Result<Option<usize>, String> {
    match line.get("max_tokens") {
        None | Some(Value::Null) => Ok(None),
        Some(m) => m
            .as_u64()
            .and_then(|m| usize::try_from(m).ok())
            .filter(|m| (1..=crate::MAX_COUNT).contains(m))
            .map(Some)
            .ok_or_else(|| format!("max_tokens {m} is not a count of 1 or more")),
    }
}

/// Who said a ShareGPT message: `human`, `gpt` or `system`, as its `from` names it (exports
/// that say `user` and `assistant` read the same).
fn speaker(message: &Value) -> Option<&'static str> {
    match message.get("from").and_then(Value::as_str)? {
        "human" | "user" => Some("human"),
        "gpt" | "assistant" => Some("gpt"),
        "system" => Some("system"),
        _ => None,
    }
}

/// A conversation's item: its first turn (after the system prompt, when there is one) as the
/// first request, the others as follow-ups; none without a turn.
fn conversation(name: String, system: Option<&str>, turns: &[&str], max_tokens: Option<usize>) -> Option<Item> {
    let (first, rest) = turns.split_first()?;
    let mut messages: Vec<Value> =
        system.map(|s| serde_json::json!({"role": "system", "content": s})).into_iter().collect();
    messages.push(serde_json::json!({"role": "user", "content": first}));
    Some(Item {
        name,
        prompt: system.map_or_else(|| first.to_string(), |s| format!("{s}\n{first}")),
        messages: Some(Value::Array(messages)),
        max_tokens,
        follow_ups: rest.iter().map(|t| t.to_string()).collect(),
    })
}

/// A checkpoint folder's `tokenizer.json` (`shown`: the folder as recorded), its bytes (for the
/// workload's digest) and the error that names it.
#[allow(clippy::type_complexity)] // the tokenizer, its file, and the one error its later failures map to
fn load_tokenizer(
    dir: &Path,
    shown: &str,
) -> Result<(tokenizers::Tokenizer, Vec<u8>, impl Fn(String) -> WorkloadError), WorkloadError> {
    let file = format!("{}/tokenizer.json", shown.trim_end_matches('/'));
    let error = move |cause: String| WorkloadError::Tokenizer { path: file.clone(), cause };
    let bytes = std::fs::read(dir.join("tokenizer.json")).map_err(|e| error(e.to_string()))?;
    let tokenizer = tokenizers::Tokenizer::from_bytes(&bytes).map_err(|e| error(e.to_string()))?;
    Ok((tokenizer, bytes, error))
}

impl Workload {
    /// The seed's three prompts, in the seed's order.
    pub fn builtin() -> Self {
        let prompts = crate::workload::default_prompts();
        let items: Vec<Item> = ["short", "medium", "code"]
            .iter()
            .filter_map(|k| prompts.get(*k).map(|p| (k, p)))
            .map(|(k, p)| Item { name: k.to_string(), prompt: p.clone(), ..Item::default() })
            .collect();
        Self::new("builtin", None, None, items)
    }

    /// `--prompts FILE.jsonl`.
    pub fn jsonl(path: &Path, shown: &str) -> Result<Self, WorkloadError> {
        let bytes = read(path, shown)?;
        let text = String::from_utf8_lossy(&bytes);
        let mut items = Vec::new();
        for (n, line) in text.lines().enumerate() {
            if line.trim().is_empty() {
                continue;
            }
            let bad = |problem: String| WorkloadError::Line { path: shown.to_string(), line: n + 1, problem };
            let v: Value = serde_json::from_str(line).map_err(|e| bad(format!("not JSON ({e})")))?;
            let max_tokens = max_tokens_of(&v).map_err(bad)?;
            let name = format!("line-{}", n + 1);
            let item = match (v.get("prompt").and_then(Value::as_str), v.get("messages")) {
                (Some(p), None) => Item { name, prompt: p.to_string(), max_tokens, ..Item::default() },
                (None, Some(m)) => {
                    let turns = m
                        .as_array()
                        .filter(|t| !t.is_empty())
                        .ok_or_else(|| bad("messages is not a non-empty array".into()))?;
                    let mut contents = Vec::new();
                    for t in turns {
                        match (t.get("role").and_then(Value::as_str), t.get("content").and_then(Value::as_str)) {
                            (Some(_), Some(c)) => contents.push(c),
                            _ => return Err(bad("a message without a string role and content".into())),
                        }
                    }
                    Item { name, prompt: contents.join("\n"), messages: Some(m.clone()), max_tokens, ..Item::default() }
                }
                _ => return Err(bad("neither a string prompt nor messages (exactly one)".into())),
            };
            items.push(item);
        }
        if items.is_empty() {
            return Err(WorkloadError::Empty { path: shown.to_string(), expected: JSONL_LINE });
        }
        Ok(Self::new("jsonl", Some(shown), Some(&bytes), items))
    }

    /// `--sharegpt FILE.json`: the first human turn of each conversation that has one. As vLLM's
    /// benchmark does, the reply that follows it sets the request's cap: its length in tokens as
    /// `tokenizer_dir`'s tokenizer counts them (`shown` names it), so the load has the
    /// conversations' own output lengths; without a tokenizer, or without a reply, the run's
    /// `max_tokens` applies.
    pub fn sharegpt(path: &Path, shown: &str, tokenizer_dir: Option<(&Path, &str)>) -> Result<Self, WorkloadError> {
        let bytes = read(path, shown)?;
        let bad = |problem: String| WorkloadError::ShareGpt { path: shown.to_string(), problem };
        let v: Value = serde_json::from_slice(&bytes).map_err(|e| bad(format!("not JSON ({e})")))?;
        let conversations = v.as_array().ok_or_else(|| bad("not an array".into()))?;
        let tokenizer = tokenizer_dir.map(|(dir, shown)| load_tokenizer(dir, shown)).transpose()?;
        let mut items = Vec::new();
        for (i, c) in conversations.iter().enumerate() {
            let Some(turns) = c.get("conversations").and_then(Value::as_array) else { continue };
            let from = |t: &Value, who: &str| speaker(t) == Some(who);
            let Some(at) = turns.iter().position(|t| from(t, "human")) else { continue };
            let text = turns[at].get("value").and_then(Value::as_str).unwrap_or_default().trim();
            if text.is_empty() {
                continue;
            }
            let reply = turns.get(at + 1).filter(|t| from(t, "gpt")).and_then(|t| t.get("value")?.as_str());
            let max_tokens = match (&tokenizer, reply) {
                (Some((tokenizer, _, error)), Some(reply)) => {
                    let ids = tokenizer.encode(reply, false).map_err(|e| error(e.to_string()))?;
                    // An empty reply asks for nothing; a request needs at least one token.
                    Some(ids.get_ids().len().max(1))
                }
                _ => None,
            };
            items.push(Item {
                name: format!("conversation-{i}"),
                prompt: text.to_string(),
                max_tokens,
                ..Item::default()
            });
        }
        if items.is_empty() {
            return Err(WorkloadError::Empty { path: shown.to_string(), expected: SHAREGPT_SHAPE });
        }
        let mut w = Self::new("sharegpt", Some(shown), Some(&bytes), items);
        w.record.lengths = Some(match tokenizer_dir {
            Some((_, shown)) => format!("output: each reply's length in tokens ({shown}/tokenizer.json)"),
            None => "output: max_tokens (no tokenizer to count the replies with)".into(),
        });
        Ok(w)
    }

    /// `count` synthetic prompts of `input` tokens each (as `tokenizer_dir`'s tokenizer counts
    /// them: everyday English words drawn from `seed`), each capped at `output` tokens.
    pub fn synthetic(
        tokenizer_dir: &Path,
        shown: &str,
        input: Lengths,
        output: Lengths,
        count: usize,
        seed: u64,
    ) -> Result<Self, WorkloadError> {
        use rand::SeedableRng;
        let what = || format!("--synthetic-count {count} with --input-tokens {}", input.describe());
        let mut words = Words::new(tokenizer_dir, shown, what, count as u128 * input.max() as u128)?;
        let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(seed);
        let mut items = Vec::with_capacity(count);
        let mut counts = Vec::with_capacity(count);
        for i in 0..count {
            let (want, cap) = (input.draw(&mut rng), output.draw(&mut rng));
            let (prompt, tokens) = words.text(want, &mut rng)?;
            counts.push(tokens as f64);
            items.push(Item { name: format!("synthetic-{i}"), prompt, max_tokens: Some(cap), ..Item::default() });
        }
        let lengths = format!("input {}, output {}", input.describe(), output.describe());
        Ok(Self::new("synthetic", Some(shown), Some(&words.bytes), items).with_tokens(lengths, &counts))
    }

    /// `--shared-prefix`: `shape.groups` system prompts of `shape.prefix` tokens, each shared by
    /// `shape.prompts` chat requests whose questions are `shape.question` tokens (as
    /// `tokenizer_dir`'s tokenizer counts them: everyday English words drawn from `seed`). Sent
    /// one question of every group in turn, so each group's prefix comes back while the others'
    /// are in use too.
    pub fn shared_prefix(
        tokenizer_dir: &Path,
        shown: &str,
        shape: SharedPrefix,
        seed: u64,
    ) -> Result<Self, WorkloadError> {
        use rand::SeedableRng;
        let SharedPrefix { groups, prompts, prefix, question } = shape;
        let tokens = groups as u128 * (prefix as u128 + prompts as u128 * question as u128);
        let what = || format!("--shared-prefix {groups}:{prompts}:{prefix}:{question}");
        let mut words = Words::new(tokenizer_dir, shown, what, tokens)?;
        let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(seed);
        let mut prefixes = Vec::with_capacity(shape.groups);
        for _ in 0..shape.groups {
            prefixes.push(words.text(shape.prefix, &mut rng)?);
        }
        let mut questions = Vec::with_capacity(shape.groups * shape.prompts);
        for _ in 0..shape.groups * shape.prompts {
            questions.push(words.text(shape.question, &mut rng)?);
        }
        let mut items = Vec::with_capacity(questions.len());
        let mut counts = Vec::with_capacity(questions.len());
        for q in 0..shape.prompts {
            for (g, (prefix, prefix_tokens)) in prefixes.iter().enumerate() {
                let (question, question_tokens) = &questions[g * shape.prompts + q];
                let messages = serde_json::json!([
                    {"role": "system", "content": prefix},
                    {"role": "user", "content": question},
                ]);
                counts.push((prefix_tokens + question_tokens) as f64);
                items.push(Item {
                    name: format!("group-{g}-{q}"),
                    prompt: format!("{prefix}\n{question}"),
                    messages: Some(messages),
                    ..Item::default()
                });
            }
        }
        Ok(Self::new("shared-prefix", Some(shown), Some(&words.bytes), items).with_tokens(shape.describe(), &counts))
    }

    /// `--conversations FILE`: multi-turn conversations, each turn sent after the server's reply
    /// to the one before. A JSON Lines file holds one `{"turns": [TEXT, ...]}` per line, with an
    /// optional `"system"` prompt and `"max_tokens"` (each turn's cap); a ShareGPT export (a
    /// JSON array) gives each conversation's human turns, after its system prompt if it has one,
    /// its recorded replies replaced by the server's own.
    pub fn conversations(path: &Path, shown: &str) -> Result<Self, WorkloadError> {
        let bytes = read(path, shown)?;
        let text = String::from_utf8_lossy(&bytes);
        let mut items = Vec::new();
        if text.trim_start().starts_with('[') {
            let bad = |problem: String| WorkloadError::ShareGpt { path: shown.to_string(), problem };
            let v: Value = serde_json::from_str(&text).map_err(|e| bad(format!("not JSON ({e})")))?;
            for (i, c) in v.as_array().into_iter().flatten().enumerate() {
                let Some(messages) = c.get("conversations").and_then(Value::as_array) else { continue };
                let said = |who: &'static str| {
                    messages
                        .iter()
                        .filter(move |t| speaker(t) == Some(who))
                        .filter_map(|t| t.get("value")?.as_str())
                        .map(str::trim)
                        .filter(|t| !t.is_empty())
                };
                let turns: Vec<&str> = said("human").collect();
                if turns.len() > MAX_TURNS {
                    return Err(bad(format!(
                        "conversation {i} has {} human turns, more than {MAX_TURNS}; split it or leave it out",
                        turns.len()
                    )));
                }
                if let Some(item) = conversation(format!("conversation-{i}"), said("system").next(), &turns, None) {
                    items.push(item);
                }
            }
        } else {
            for (n, line) in text.lines().enumerate() {
                if line.trim().is_empty() {
                    continue;
                }
                let bad =
                    |problem: String| WorkloadError::Conversation { path: shown.to_string(), line: n + 1, problem };
                let v: Value = serde_json::from_str(line).map_err(|e| bad(format!("not JSON ({e})")))?;
                let turns: Vec<&str> = v
                    .get("turns")
                    .and_then(Value::as_array)
                    .and_then(|t| t.iter().map(Value::as_str).collect::<Option<Vec<_>>>())
                    .filter(|t| (1..=MAX_TURNS).contains(&t.len()))
                    .ok_or_else(|| bad(format!("turns is not an array of 1 to {MAX_TURNS} strings")))?;
                let system = match v.get("system") {
                    None | Some(Value::Null) => None,
                    Some(s) => Some(s.as_str().ok_or_else(|| bad("system is not a string".into()))?),
                };
                let max_tokens = max_tokens_of(&v).map_err(bad)?;
                items.extend(conversation(format!("line-{}", n + 1), system, &turns, max_tokens));
            }
        }
        if items.is_empty() {
            return Err(WorkloadError::Empty { path: shown.to_string(), expected: CONVERSATIONS_SHAPE });
        }
        Ok(Self::new("conversations", Some(shown), Some(&bytes), items))
    }

    /// `--multi-turn`: `shape.conversations` conversations of `shape.turns` turns, each with a
    /// system prompt of `shape.system` tokens of its own and user turns of `shape.question`
    /// tokens (as `tokenizer_dir`'s tokenizer counts them: everyday English words drawn from
    /// `seed`). Each turn resends the history with the server's replies, so all but the newest
    /// question is a prefix the server has seen.
    pub fn multi_turn(tokenizer_dir: &Path, shown: &str, shape: MultiTurn, seed: u64) -> Result<Self, WorkloadError> {
        use rand::SeedableRng;
        let MultiTurn { conversations, turns, system, question } = shape;
        let tokens = conversations as u128 * (system as u128 + turns as u128 * question as u128);
        let what = || format!("--multi-turn {conversations}:{turns}:{system}:{question}");
        let mut words = Words::new(tokenizer_dir, shown, what, tokens)?;
        let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(seed);
        let mut items = Vec::with_capacity(shape.conversations);
        let mut counts = Vec::with_capacity(shape.conversations);
        for c in 0..shape.conversations {
            let (system, system_tokens) = words.text(shape.system, &mut rng)?;
            let mut turns = Vec::with_capacity(shape.turns);
            for _ in 0..shape.turns {
                turns.push(words.text(shape.question, &mut rng)?);
            }
            counts.push((system_tokens + turns[0].1) as f64);
            let texts: Vec<&str> = turns.iter().map(|(t, _)| t.as_str()).collect();
            items.extend(conversation(format!("conversation-{c}"), Some(&system), &texts, None));
        }
        Ok(Self::new("multi-turn", Some(shown), Some(&words.bytes), items).with_tokens(shape.describe(), &counts))
    }

    /// The record with how the lengths were drawn and the prompts' lengths in tokens.
    fn with_tokens(mut self, lengths: String, counts: &[f64]) -> Self {
        let s = records::stats::summarize(counts);
        let r = &mut self.record;
        r.lengths = Some(lengths);
        (r.prompt_tokens_min, r.prompt_tokens_p50, r.prompt_tokens_mean, r.prompt_tokens_max) =
            (s.min, s.p50, s.mean, s.max);
        self
    }

    fn new(source: &str, path: Option<&str>, bytes: Option<&[u8]>, items: Vec<Item>) -> Self {
        // The digest of what is sent, so even the built-in prompts compare across versions.
        let canonical: Vec<Value> = items
            .iter()
            .map(|i| {
                let mut item =
                    serde_json::json!({"prompt": i.prompt, "messages": i.messages, "max_tokens": i.max_tokens});
                // Named only for conversations, so single requests digest as they always did.
                if !i.follow_ups.is_empty() {
                    item["follow_ups"] = serde_json::json!(i.follow_ups);
                }
                item
            })
            .collect();
        let digest = supply::digest::bytes_digest(
            Value::Array(canonical).to_string().as_bytes(),
            supply::digest::Algorithm::Sha256,
        );
        let s = prompt_chars(items.iter().map(|i| i.prompt.as_str()));
        let record = WorkloadRecord {
            source: source.to_string(),
            path: path.map(str::to_string),
            file_sha256: bytes.map(|b| supply::digest::bytes_digest(b, supply::digest::Algorithm::Sha256)),
            items_sha256: digest,
            items: items.len(),
            prompt_chars_min: s.min,
            prompt_chars_p50: s.p50,
            prompt_chars_mean: s.mean,
            prompt_chars_max: s.max,
            items_with_max_tokens: items.iter().filter(|i| i.max_tokens.is_some()).count(),
            lengths: None,
            prompt_tokens_min: None,
            prompt_tokens_p50: None,
            prompt_tokens_mean: None,
            prompt_tokens_max: None,
            conversation_turns: match conversational(&items) {
                true => items.iter().map(Item::turns).collect(),
                false => Vec::new(),
            },
        };
        Workload { items, record }
    }
}

/// Texts of a given length in tokens, of everyday English words: a generated workload's prompts.
struct Words {
    tokenizer: tokenizers::Tokenizer,
    /// `tokenizer.json`'s bytes, for the workload's record.
    bytes: Vec<u8>,
    error: Box<dyn Fn(String) -> WorkloadError>,
    words: Vec<&'static str>,
    /// Tokens drawn of those asked for, on a bar when there are enough to take seconds.
    progress: indicatif::ProgressBar,
}

impl Words {
    /// Ready to draw `tokens` tokens of text in all, at most [`MAX_GENERATED_TOKENS`]: drawing
    /// costs tokenizer work in proportion, before anything is sent (`what` names the flags that
    /// asked for more).
    fn new(
        tokenizer_dir: &Path,
        shown: &str,
        what: impl FnOnce() -> String,
        tokens: u128,
    ) -> Result<Self, WorkloadError> {
        if tokens > MAX_GENERATED_TOKENS {
            return Err(WorkloadError::TooLarge { what: what(), tokens });
        }
        let (tokenizer, bytes, error) = load_tokenizer(tokenizer_dir, shown)?;
        let words = supply::generate::ENGLISH_WORDS.split_whitespace().collect();
        let progress = match tokens >= 1 << 20 {
            true => indicatif::ProgressBar::new(tokens as u64)
                .with_style(
                    indicatif::ProgressStyle::with_template(
                        "drawing the workload [{bar:30}] {pos}/{len} tokens, {eta} left",
                    )
                    .expect("a valid template")
                    .progress_chars("=> "),
                )
                .with_finish(indicatif::ProgressFinish::AndClear),
            false => indicatif::ProgressBar::hidden(),
        };
        Ok(Words { tokenizer, bytes, error: Box::new(error), words, progress })
    }

    /// A text of `want` tokens drawn from `rng`, and the tokens it encodes to again (which may
    /// differ by one where the cut split a word).
    fn text(&mut self, want: usize, rng: &mut impl rand::Rng) -> Result<(String, usize), WorkloadError> {
        let encode = |text: &str| self.tokenizer.encode(text, false).map_err(|e| (self.error)(e.to_string()));
        // Words until the text has enough tokens, then exactly `want` of them, decoded.
        let mut text = String::new();
        let ids = loop {
            for _ in 0..want.max(8) {
                text.push_str(self.words[rng.random_range(0..self.words.len())]);
                text.push(' ');
            }
            let enc = encode(&text)?;
            if enc.get_ids().len() >= want {
                break enc.get_ids()[..want].to_vec();
            }
        };
        let prompt = self.tokenizer.decode(&ids, true).map_err(|e| (self.error)(e.to_string()))?;
        let sent = encode(&prompt)?.get_ids().len();
        self.progress.inc(want as u64);
        Ok((prompt, sent))
    }
}

/// The spread of the prompts' lengths in characters, as a workload's record gives it (and the
/// audit recomputes it from the prompts an artifact holds, when it holds every item's).
pub fn prompt_chars<'a>(prompts: impl Iterator<Item = &'a str>) -> records::stats::Summary {
    let lengths: Vec<f64> = prompts.map(|p| p.chars().count() as f64).collect();
    records::stats::summarize(&lengths)
}

fn read(path: &Path, shown: &str) -> Result<Vec<u8>, WorkloadError> {
    std::fs::read(path).map_err(|cause| WorkloadError::Read { path: shown.to_string(), cause })
}

/// The seed's prompts: the defaults.
pub fn default_prompts() -> BTreeMap<String, String> {
    [
        ("short", "In exactly four concise bullet points, explain why database transactions are useful. Do not use a heading."),
        ("medium", "You are reviewing a Laravel service that transfers money between two accounts. Explain the failure modes involving concurrency, partial writes, retries, and audit logs. Then provide a robust implementation plan. Keep the response technical and concise."),
        ("code", "Write a Python 3.12 function named merge_intervals that accepts a list of integer pairs, validates each pair, merges overlapping or adjacent intervals, and returns sorted tuples. Include type hints, a short docstring, and five assert-based examples. Output only code."),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_string(), v.to_string()))
    .collect()
}

#[cfg(test)]
mod tests;
