//! What the client sends: the seed's three prompts, or a file of prompts (`--prompts FILE.jsonl`,
//! one `{"prompt": ...}` or `{"messages": [...]}` per line with an optional `max_tokens`), or a
//! ShareGPT export (`--sharegpt FILE.json`, each conversation's first human turn), or synthetic
//! prompts whose input and output lengths in tokens are drawn from named distributions
//! (`--input-tokens`, `--output-tokens`), or groups of chat requests that share a system prompt
//! (`--shared-prefix`), both counted with the model's tokenizer. The artifact
//! records the workload's digest and its length statistics, so two runs say whether they sent
//! the same requests.

use crate::serving::WorkloadRecord;
use serde_json::Value;
use std::path::Path;

/// One request's content.
#[derive(Debug, Clone, PartialEq)]
pub struct Item {
    /// Its name in the records (`short`, `line-12`, `conversation-3`).
    pub name: String,
    /// The text (the only content for `/v1/completions`; for chat, one user message).
    pub prompt: String,
    /// A whole conversation for chat endpoints, when the file gives one.
    pub messages: Option<Value>,
    /// Its own cap on generated tokens, when the file gives one.
    pub max_tokens: Option<usize>,
}

/// The items to send in turn, and the record of where they came from.
#[derive(Debug, Clone)]
pub struct Workload {
    pub items: Vec<Item>,
    pub record: WorkloadRecord,
}

/// Why a workload file was refused.
#[derive(Debug, thiserror::Error)]
pub enum WorkloadError {
    #[error("{path}: {cause}")]
    Read { path: String, cause: std::io::Error },
    #[error("{path}:{line}: {problem}; each line is {{\"prompt\": TEXT}} or {{\"messages\": [...]}}, with an optional \"max_tokens\"")]
    Line { path: String, line: usize, problem: String },
    #[error("{path}: {problem}; a ShareGPT file is a JSON array of {{\"conversations\": [{{\"from\": \"human\", \"value\": TEXT}}, ...]}}")]
    ShareGpt { path: String, problem: String },
    #[error("{path}: no prompts in it")]
    Empty { path: String },
    #[error("{path}: {cause}; give --tokenizer DIR, a folder holding the target model's tokenizer.json")]
    Tokenizer { path: String, cause: String },
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

/// A distribution of token counts: `fixed:N`, `uniform:LO:HI` (both included) or
/// `normal:MEAN:SD:LO:HI` (drawn, then held within LO..=HI).
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Lengths {
    Fixed(usize),
    Uniform(usize, usize),
    Normal { mean: f64, sd: f64, lo: usize, hi: usize },
}

/// A `--input-tokens` or `--output-tokens` value that names no distribution.
#[derive(Debug, thiserror::Error)]
#[error("`{0}` is not a length distribution: fixed:N, uniform:LO:HI or normal:MEAN:SD:LO:HI, counts from 1 to {max}", max = MAX_SYNTHETIC_TOKENS)]
pub struct LengthsError(String);

/// The longest synthetic prompt or answer, in tokens.
pub const MAX_SYNTHETIC_TOKENS: usize = 1 << 17;

impl Lengths {
    pub fn parse(s: &str) -> Result<Self, LengthsError> {
        let bad = || LengthsError(s.to_string());
        let parts: Vec<&str> = s.split(':').collect();
        let count =
            |p: &str| p.parse::<usize>().ok().filter(|n| (1..=MAX_SYNTHETIC_TOKENS).contains(n)).ok_or_else(bad);
        let real = |p: &str| p.parse::<f64>().ok().filter(|v| v.is_finite() && *v >= 0.0).ok_or_else(bad);
        let lengths = match parts.as_slice() {
            ["fixed", n] => Lengths::Fixed(count(n)?),
            ["uniform", lo, hi] => Lengths::Uniform(count(lo)?, count(hi)?),
            ["normal", mean, sd, lo, hi] => {
                Lengths::Normal { mean: real(mean)?, sd: real(sd)?, lo: count(lo)?, hi: count(hi)? }
            }
            _ => return Err(bad()),
        };
        match lengths {
            Lengths::Uniform(lo, hi) | Lengths::Normal { lo, hi, .. } if lo > hi => Err(bad()),
            l => Ok(l),
        }
    }

    fn draw(self, rng: &mut impl rand::Rng) -> usize {
        match self {
            Lengths::Fixed(n) => n,
            Lengths::Uniform(lo, hi) => rng.random_range(lo..=hi),
            Lengths::Normal { mean, sd, lo, hi } => {
                let v = rand_distr::Normal::new(mean, sd)
                    .map(|d| rand_distr::Distribution::sample(&d, rng))
                    .unwrap_or(mean);
                (v.round().max(lo as f64).min(hi as f64)) as usize
            }
        }
    }

    /// As written on the command line.
    pub fn describe(self) -> String {
        match self {
            Lengths::Fixed(n) => format!("fixed:{n}"),
            Lengths::Uniform(lo, hi) => format!("uniform:{lo}:{hi}"),
            Lengths::Normal { mean, sd, lo, hi } => format!("normal:{mean}:{sd}:{lo}:{hi}"),
        }
    }
}

impl Workload {
    /// The seed's three prompts, in the seed's order.
    pub fn builtin() -> Self {
        let prompts = crate::serving::default_prompts();
        let items: Vec<Item> = ["short", "medium", "code"]
            .iter()
            .filter_map(|k| prompts.get(*k).map(|p| (k, p)))
            .map(|(k, p)| Item { name: k.to_string(), prompt: p.clone(), messages: None, max_tokens: None })
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
            let max_tokens = match v.get("max_tokens") {
                None | Some(Value::Null) => None,
                Some(m) => Some(
                    m.as_u64()
                        .and_then(|m| usize::try_from(m).ok())
                        .filter(|m| (1..=crate::serving::MAX_COUNT).contains(m))
                        .ok_or_else(|| bad(format!("max_tokens {m} is not a count of 1 or more")))?,
                ),
            };
            let name = format!("line-{}", n + 1);
            let item = match (v.get("prompt").and_then(Value::as_str), v.get("messages")) {
                (Some(p), None) => Item { name, prompt: p.to_string(), messages: None, max_tokens },
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
                    Item { name, prompt: contents.join("\n"), messages: Some(m.clone()), max_tokens }
                }
                _ => return Err(bad("neither a string prompt nor messages (exactly one)".into())),
            };
            items.push(item);
        }
        if items.is_empty() {
            return Err(WorkloadError::Empty { path: shown.to_string() });
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
            let from = |t: &Value, who: &str| t.get("from").and_then(Value::as_str) == Some(who);
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
                messages: None,
                max_tokens,
            });
        }
        if items.is_empty() {
            return Err(WorkloadError::Empty { path: shown.to_string() });
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
        let mut words = Words::new(tokenizer_dir, shown)?;
        let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(seed);
        let mut items = Vec::with_capacity(count);
        let mut counts = Vec::with_capacity(count);
        for i in 0..count {
            let (want, cap) = (input.draw(&mut rng), output.draw(&mut rng));
            let (prompt, tokens) = words.text(want, &mut rng)?;
            counts.push(tokens as f64);
            items.push(Item { name: format!("synthetic-{i}"), prompt, messages: None, max_tokens: Some(cap) });
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
        let mut words = Words::new(tokenizer_dir, shown)?;
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
                    max_tokens: None,
                });
            }
        }
        Ok(Self::new("shared-prefix", Some(shown), Some(&words.bytes), items).with_tokens(shape.describe(), &counts))
    }

    /// The record with how the lengths were drawn and the prompts' lengths in tokens.
    fn with_tokens(mut self, lengths: String, counts: &[f64]) -> Self {
        let s = common::stats::summarize(counts);
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
            .map(|i| serde_json::json!({"prompt": i.prompt, "messages": i.messages, "max_tokens": i.max_tokens}))
            .collect();
        let digest = common::digest::bytes_digest(
            Value::Array(canonical).to_string().as_bytes(),
            common::digest::Algorithm::Sha256,
        );
        let s = prompt_chars(items.iter().map(|i| i.prompt.as_str()));
        let record = WorkloadRecord {
            source: source.to_string(),
            path: path.map(str::to_string),
            file_sha256: bytes.map(|b| common::digest::bytes_digest(b, common::digest::Algorithm::Sha256)),
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
}

impl Words {
    fn new(tokenizer_dir: &Path, shown: &str) -> Result<Self, WorkloadError> {
        let (tokenizer, bytes, error) = load_tokenizer(tokenizer_dir, shown)?;
        let words = common::generate::ENGLISH_WORDS.split_whitespace().collect();
        Ok(Words { tokenizer, bytes, error: Box::new(error), words })
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
        Ok((prompt, sent))
    }
}

/// A `--shared-prefix` shape: `groups` system prompts of `prefix` tokens, each shared by
/// `prompts` requests with questions of `question` tokens.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SharedPrefix {
    pub groups: usize,
    pub prompts: usize,
    pub prefix: usize,
    pub question: usize,
}

/// A `--shared-prefix` value that is no shape.
#[derive(Debug, thiserror::Error)]
#[error("`{0}` is not a shared-prefix shape: GROUPS:PROMPTS:PREFIX:QUESTION, e.g. 1:32:1000:24 (groups and prompts from 1 to 10000, token counts from 1 to {max})", max = MAX_SYNTHETIC_TOKENS)]
pub struct SharedPrefixError(String);

impl SharedPrefix {
    pub fn parse(s: &str) -> Result<Self, SharedPrefixError> {
        let bad = || SharedPrefixError(s.to_string());
        let n = |p: &str, max: usize| p.parse::<usize>().ok().filter(|n| (1..=max).contains(n)).ok_or_else(bad);
        match s.split(':').collect::<Vec<_>>().as_slice() {
            [g, p, s, q] => Ok(SharedPrefix {
                groups: n(g, 10_000)?,
                prompts: n(p, 10_000)?,
                prefix: n(s, MAX_SYNTHETIC_TOKENS)?,
                question: n(q, MAX_SYNTHETIC_TOKENS)?,
            }),
            _ => Err(bad()),
        }
    }

    /// As the record and the command line give it.
    pub fn describe(self) -> String {
        let SharedPrefix { groups, prompts, prefix, question } = self;
        format!("{groups}:{prompts}:{prefix}:{question} ({groups} groups of {prompts} prompts: a shared system prompt of {prefix} tokens, a question of {question})")
    }
}

/// The spread of the prompts' lengths in characters, as a workload's record gives it (and the
/// audit recomputes it from the prompts an artifact holds, when it holds every item's).
pub fn prompt_chars<'a>(prompts: impl Iterator<Item = &'a str>) -> common::stats::Summary {
    let lengths: Vec<f64> = prompts.map(|p| p.chars().count() as f64).collect();
    common::stats::summarize(&lengths)
}

fn read(path: &Path, shown: &str) -> Result<Vec<u8>, WorkloadError> {
    std::fs::read(path).map_err(|cause| WorkloadError::Read { path: shown.to_string(), cause })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn jsonl_reads_prompts_and_conversations_and_names_a_bad_line() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("p.jsonl");
        std::fs::write(
            &path,
            "{\"prompt\": \"hello\", \"max_tokens\": 7}\n\n{\"messages\": [{\"role\": \"system\", \"content\": \"be brief\"}, {\"role\": \"user\", \"content\": \"hi\"}]}\n",
        )
        .unwrap();
        let w = Workload::jsonl(&path, "p.jsonl").unwrap();
        assert_eq!(w.items.len(), 2);
        assert_eq!((w.items[0].name.as_str(), w.items[0].max_tokens), ("line-1", Some(7)));
        assert_eq!((w.items[1].name.as_str(), w.items[1].prompt.as_str()), ("line-3", "be brief\nhi"));
        assert!(w.items[1].messages.is_some());
        assert_eq!((w.record.items, w.record.items_with_max_tokens, w.record.prompt_chars_max), (2, 1, Some(11.0)));
        // The same items give the same digest whatever the file's bytes around them.
        std::fs::write(&path, "{\"max_tokens\": 7, \"prompt\": \"hello\"}\n{\"messages\": [{\"role\": \"system\", \"content\": \"be brief\"}, {\"role\": \"user\", \"content\": \"hi\"}]}").unwrap();
        let again = Workload::jsonl(&path, "p.jsonl").unwrap();
        assert_eq!(again.record.items_sha256, w.record.items_sha256);
        assert_ne!(again.record.file_sha256, w.record.file_sha256);
        for (line, expected) in [
            ("{\"prompt\": 3}", "p.jsonl:1: neither a string prompt nor messages"),
            ("{\"prompt\": \"x\", \"max_tokens\": 0}", "p.jsonl:1: max_tokens 0 is not a count"),
            ("{\"messages\": []}", "p.jsonl:1: messages is not a non-empty array"),
            ("not json", "p.jsonl:1: not JSON"),
        ] {
            std::fs::write(&path, line).unwrap();
            let err = Workload::jsonl(&path, "p.jsonl").unwrap_err().to_string();
            assert!(err.starts_with(expected), "{err}");
        }
    }

    #[test]
    fn length_distributions_parse_and_refuse_what_they_cannot_draw() {
        assert_eq!(Lengths::parse("fixed:128").unwrap(), Lengths::Fixed(128));
        assert_eq!(Lengths::parse("uniform:64:256").unwrap(), Lengths::Uniform(64, 256));
        assert_eq!(
            Lengths::parse("normal:200:50:16:400").unwrap(),
            Lengths::Normal { mean: 200.0, sd: 50.0, lo: 16, hi: 400 }
        );
        for bad in ["fixed:0", "uniform:9:3", "normal:1:1:5:2", "gauss:3", "fixed:-1", "uniform:1", "fixed:999999999"] {
            assert!(Lengths::parse(bad).is_err(), "{bad}");
        }
        let mut rng = <rand_chacha::ChaCha8Rng as rand::SeedableRng>::seed_from_u64(1);
        let drawn: Vec<usize> =
            (0..2000).map(|_| Lengths::Normal { mean: 50.0, sd: 30.0, lo: 20, hi: 90 }.draw(&mut rng)).collect();
        assert!(drawn.iter().all(|n| (20..=90).contains(n)) && drawn.contains(&20) && drawn.contains(&90));
        assert!((0..500).map(|_| Lengths::Uniform(3, 5).draw(&mut rng)).all(|n| (3..=5).contains(&n)));
    }

    #[test]
    fn sharegpt_takes_each_first_human_turn() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("s.json");
        std::fs::write(
            &path,
            r#"[{"id": "a", "conversations": [{"from": "human", "value": "Why is the sky blue?"}, {"from": "gpt", "value": "Rayleigh."}]},
                {"id": "b", "conversations": [{"from": "gpt", "value": "no human here"}]},
                {"id": "c", "conversations": [{"from": "system", "value": "s"}, {"from": "human", "value": "Name a prime."}]}]"#,
        )
        .unwrap();
        let w = Workload::sharegpt(&path, "s.json", None).unwrap();
        let names: Vec<&str> = w.items.iter().map(|i| i.name.as_str()).collect();
        assert_eq!(names, ["conversation-0", "conversation-2"]);
        assert_eq!(w.items[1].prompt, "Name a prime.");
        assert_eq!(w.record.source, "sharegpt");
        std::fs::write(&path, "{}").unwrap();
        assert!(Workload::sharegpt(&path, "s.json", None).unwrap_err().to_string().contains("not an array"));
    }

    #[test]
    fn shared_prefix_groups_share_their_system_prompt_and_are_drawn_from_the_seed() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path().join("tiny");
        common::generate::generate_into(&common::generate::shape("tiny").unwrap(), &dir, false).unwrap();
        let shape = SharedPrefix::parse("2:3:100:10").unwrap();
        assert_eq!(shape, SharedPrefix { groups: 2, prompts: 3, prefix: 100, question: 10 });
        let w = Workload::shared_prefix(&dir, "tiny", shape, 7).unwrap();
        let names: Vec<&str> = w.items.iter().map(|i| i.name.as_str()).collect();
        assert_eq!(names, ["group-0-0", "group-1-0", "group-0-1", "group-1-1", "group-0-2", "group-1-2"]);
        let system = |i: usize| w.items[i].messages.as_ref().unwrap()[0]["content"].as_str().unwrap().to_string();
        let question = |i: usize| w.items[i].messages.as_ref().unwrap()[1]["content"].as_str().unwrap().to_string();
        assert_eq!((system(0), system(1)), (system(2), system(3)), "a group shares its system prompt");
        assert_ne!(system(0), system(1), "groups do not");
        assert_ne!(question(0), question(2), "each request has its own question");
        let (tokenizer, _, _) = load_tokenizer(&dir, "tiny").unwrap();
        let count = |t: &str| tokenizer.encode(t, false).unwrap().get_ids().len();
        assert!((99..=101).contains(&count(&system(0))) && (9..=11).contains(&count(&question(0))));
        assert_eq!((w.record.source.as_str(), w.record.items), ("shared-prefix", 6));
        assert!(w.record.lengths.as_deref().unwrap().starts_with("2:3:100:10 "));
        let again = Workload::shared_prefix(&dir, "tiny", shape, 7).unwrap();
        assert_eq!(again.record.items_sha256, w.record.items_sha256, "the seed draws the same prompts");
        let other = Workload::shared_prefix(&dir, "tiny", shape, 8).unwrap();
        assert_ne!(other.record.items_sha256, w.record.items_sha256);
        for bad in ["1:2:3", "0:1:1:1", "1:1:0:1", "1:1:1:x", "1:1:1:999999999"] {
            assert!(
                SharedPrefix::parse(bad).unwrap_err().to_string().contains("GROUPS:PROMPTS:PREFIX:QUESTION"),
                "{bad}"
            );
        }
    }
}
