//! Checked outputs: what each answer says of itself ([`output_inconsistency`]), and, for targets
//! that serve the same weights greedily (`check_agreement`), whether they gave the same answers,
//! request by request, and why not where they did not.
//!
//! Two correct implementations of one model can still part where the model's two best tokens are
//! nearly tied: their arithmetic differs in the last bits, and greedy decoding turns a swapped
//! near-tie into a different answer from there on. So each prompt whose answers differed is asked
//! again of both targets, alone, with log-probabilities, and the first token where those answers
//! part is judged: a near tie when each target's own choice leads the other's by at most
//! [`NEAR_TIE_NATS`] in its own log-probabilities (a log-probability difference is the logit
//! difference, the softmax's normaliser cancelling).

use super::{Candidate, RequestRecord, Runtime, TokenChoice, PROBE_CANDIDATES};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

/// The most a target's own choice may lead the other target's choice, in its own
/// log-probabilities (nats), for a disagreement to be a near tie: a probability ratio under
/// e^0.5 = 1.65 between the two leading tokens.
pub const NEAR_TIE_NATS: f64 = 0.5;

/// What `check_agreement` found for one pair of targets.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct Agreement {
    /// The two targets, in the run's order.
    pub targets: [String; 2],
    /// Requests both answered successfully, paired by their place in the run (load, round,
    /// index, turn) and prompt.
    pub compared: usize,
    /// Of those, the pairs whose texts are the same (equal `text_sha256`).
    pub identical: usize,
    /// `identical / compared`; `null` when nothing was compared.
    pub share: Option<f64>,
    /// Each pair that differs, and where.
    pub differences: Vec<Difference>,
    /// Per prompt among the differences, what the log-probability probe found.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub explanations: Vec<Explanation>,
}

/// Two answers to one request that differ.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct Difference {
    pub prompt: String,
    pub load: String,
    pub round: usize,
    pub index: usize,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub turn: Option<usize>,
    /// The first character (Unicode scalar value, from 0) at which the texts differ; the shorter
    /// one's length when it is the other's beginning.
    pub first_char: usize,
}

/// Why one prompt's answers differed, from both targets asked again, alone, greedily, for
/// [`PROBE_CANDIDATES`] log-probabilities per token.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct Explanation {
    pub prompt: String,
    /// The first token (from 0) at which the probe's two answers part; `null` when they did not
    /// (see `note`).
    pub token: Option<usize>,
    /// Each target's token there, with its log-probability (absent for an answer that had ended).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub chosen: Vec<Option<Candidate>>,
    /// Each target's listed candidates there, best first.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub candidates: Vec<Vec<Candidate>>,
    /// Where the two answered alike asked alone: the token an answer recorded under load took at
    /// `token` instead (read from its text), which both targets' choices are then measured against.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rival: Option<String>,
    /// How far each target's own choice led the other's (or the `rival`), in its own
    /// log-probabilities (nats); `null` where that token is not among its candidates.
    pub margins: [Option<f64>; 2],
    /// Both margins known and at most [`NEAR_TIE_NATS`].
    pub near_tie: bool,
    /// What else the probe found: an answer that ended sooner, answers that agreed when asked
    /// alone, or why no log-probabilities came.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub note: Option<String>,
}

/// The definition of the output checks, recorded as the measurement note `output_checks` in
/// every artifact whose answers carry digests (an artifact from before them has none).
pub(super) fn output_checks_note() -> String {
    format!(
        "Every answer's text is digested (text_sha256); the text itself is kept under check_agreement or stop strings. An answer is inconsistent (inconsistent_outputs) when it finished by length with fewer tokens than its max_tokens as the server counted them, or its text holds a stop string it was sent. check_agreement pairs every two targets' answers to the same request (load, round, index, turn): the share identical, and where each differing pair first parts, in characters. Each prompt that differed is asked again of both, alone, for {PROBE_CANDIDATES} log-probabilities per token; at the first token where those answers part, a near tie is each target's own choice leading the other's by at most {NEAR_TIE_NATS} nats in its own log-probabilities. Where the two answer alike alone, the token is the one of that answer at which an answer recorded under load left it, and each target's choice is measured against the token that answer took there (rival)."
    )
}

/// The first character at which two texts differ (the shorter's length when it begins the other).
fn first_difference(a: &str, b: &str) -> usize {
    a.chars().zip(b.chars()).take_while(|(x, y)| x == y).count()
}

/// Every pair of targets compared request by request: a request's answers pair when both
/// succeeded and carry a digest, at the same load, round, index, turn and prompt.
pub fn compare(runtimes: &[Runtime], records: &[RequestRecord]) -> Vec<Agreement> {
    let answers: Vec<BTreeMap<Place, &RequestRecord>> = runtimes
        .iter()
        .map(|t| records.iter().filter(|r| r.runtime == t.name && compared(r)).map(|r| (place(r), r)).collect())
        .collect();
    let mut out = Vec::new();
    for i in 0..runtimes.len() {
        for j in i + 1..runtimes.len() {
            let mut pair = Agreement {
                targets: [runtimes[i].name.clone(), runtimes[j].name.clone()],
                compared: 0,
                identical: 0,
                share: None,
                differences: Vec::new(),
                explanations: Vec::new(),
            };
            for (k, a) in &answers[i] {
                let Some(b) = answers[j].get(k) else { continue };
                pair.compared += 1;
                if a.text_sha256 == b.text_sha256 {
                    pair.identical += 1;
                    continue;
                }
                let (load, round, index, turn, prompt) = k.clone();
                let first_char = first_difference(a.text.as_deref().unwrap_or(""), b.text.as_deref().unwrap_or(""));
                pair.differences.push(Difference { prompt, load, round, index, turn, first_char });
            }
            pair.share = (pair.compared > 0).then(|| pair.identical as f64 / pair.compared as f64);
            out.push(pair);
        }
    }
    out
}

/// Where an answer stands in a run: its load, round, index, turn and prompt. Two targets'
/// answers at one place are the same request's.
type Place = (String, usize, usize, Option<usize>, String);

fn place(r: &RequestRecord) -> Place {
    let load = super::load_label(r.concurrency, r.arrival.map(|a| a.rate_rps));
    (load, r.round, r.index, r.turn, r.prompt.clone())
}

/// Whether an answer is compared: a measured success whose text has a digest.
fn compared(r: &RequestRecord) -> bool {
    r.ok() && r.text_sha256.is_some() && !r.arrival.is_some_and(|a| a.warmup)
}

/// The prompts a pair's differences name, each once, in their order: those the probe asks again.
/// A later turn of a conversation is left out: its history holds each server's own replies, so
/// no single request repeats it.
pub fn differing_prompts(pair: &Agreement) -> Vec<String> {
    let mut prompts: Vec<String> = Vec::new();
    for d in pair.differences.iter().filter(|d| d.turn.unwrap_or(0) == 0) {
        if !prompts.contains(&d.prompt) {
            prompts.push(d.prompt.clone());
        }
    }
    prompts
}

/// Two answers to one request as recorded under load, where they differ: whose they are (the
/// pair's order), their texts, and the first character at which they part.
#[derive(Debug, Clone, Copy)]
pub struct Parted<'r> {
    pub names: [&'r str; 2],
    pub texts: [&'r str; 2],
    pub first_char: usize,
}

/// The first difference a pair recorded for `prompt`, with both answers' texts (`None` where a
/// text was not kept).
pub fn parted<'r>(pair: &'r Agreement, records: &'r [RequestRecord], prompt: &str) -> Option<Parted<'r>> {
    let d = pair.differences.iter().find(|d| d.prompt == prompt && d.turn.unwrap_or(0) == 0)?;
    let at: Place = (d.load.clone(), d.round, d.index, d.turn, d.prompt.clone());
    let text = |name: &str| {
        records.iter().filter(|r| r.runtime == name && compared(r) && place(r) == at).find_map(|r| r.text.as_deref())
    };
    let [a, b] = &pair.targets;
    Some(Parted { names: [a, b], texts: [text(a)?, text(b)?], first_char: d.first_char })
}

/// The probe's two answers to `prompt` judged at the first token where they part; `Err` carries
/// why a target gave no log-probabilities. When the two answer alike asked alone, the answers
/// recorded under load (`loaded`) parted elsewhere: they are judged at the token of the probe's
/// answer where one of them left it, against the token that answer took there
/// ([`Explanation::rival`], read from its text among the probe's candidates).
pub fn explain(
    prompt: &str,
    a: &Result<Vec<TokenChoice>, String>,
    b: &Result<Vec<TokenChoice>, String>,
    loaded: Option<Parted<'_>>,
) -> Explanation {
    let mut e = Explanation {
        prompt: prompt.to_string(),
        token: None,
        chosen: Vec::new(),
        candidates: Vec::new(),
        rival: None,
        margins: [None, None],
        near_tie: false,
        note: None,
    };
    let (a, b) = match (a, b) {
        (Ok(a), Ok(b)) => (a, b),
        (Err(why), _) | (_, Err(why)) => {
            e.note = Some(format!("no log-probabilities: {why}"));
            return e;
        }
    };
    let at = a.iter().zip(b).take_while(|(x, y)| x.chosen.token == y.chosen.token).count();
    if at == a.len() && at == b.len() {
        let alike = "asked again alone, both gave the same answer: the difference came with the load (arithmetic that depends on the batch)";
        e.note = Some(match loaded.and_then(|l| left_under_load(&mut e, a, b, l)) {
            Some(how) => format!("{alike}; {how}"),
            None => alike.to_string(),
        });
        (e.margins, e.near_tie) = verdict(&e);
        return e;
    }
    e.token = Some(at);
    e.chosen = vec![a.get(at).map(|c| c.chosen.clone()), b.get(at).map(|c| c.chosen.clone())];
    e.candidates = vec![
        a.get(at).map(|c| c.top.clone()).unwrap_or_default(),
        b.get(at).map(|c| c.top.clone()).unwrap_or_default(),
    ];
    if at == a.len() || at == b.len() {
        e.note = Some(format!("one answer ended after {at} tokens where the other went on"));
    }
    (e.margins, e.near_tie) = verdict(&e);
    e
}

/// For answers that agree asked alone (`a`, `b`, the same tokens): the token of theirs at which
/// one answer recorded under load left them, its candidates from both targets, and the token that
/// answer took there; says how, or `None` when neither recorded answer follows the probe's or the
/// token taken is not among the candidates.
fn left_under_load(e: &mut Explanation, a: &[TokenChoice], b: &[TokenChoice], loaded: Parted<'_>) -> Option<String> {
    let alone: String = a.iter().map(|t| t.chosen.token.as_str()).collect();
    let after = |text: &str| text.chars().skip(loaded.first_char).collect::<String>();
    let rest = after(&alone);
    // The answer that went on as the probe's did kept to it; the other left it.
    let left = match loaded.texts.map(|t| rest.starts_with(&after(t)) || after(t).starts_with(&rest)) {
        [true, false] => 1,
        [false, true] => 0,
        _ => return None,
    };
    let mut start = 0;
    let t = a.iter().position(|t| {
        let end = start + t.chosen.token.chars().count();
        let here = loaded.first_char < end;
        if !here {
            start = end;
        }
        here
    })?;
    let taken: String = loaded.texts[left].chars().skip(start).collect();
    let chosen = &a[t].chosen.token;
    let rival = a[t]
        .top
        .iter()
        .chain(&b[t].top)
        .find(|c| &c.token != chosen && !c.token.is_empty() && taken.starts_with(&c.token))?
        .token
        .clone();
    e.token = Some(t);
    e.chosen = vec![Some(a[t].chosen.clone()), Some(b[t].chosen.clone())];
    e.candidates = vec![a[t].top.clone(), b[t].top.clone()];
    e.rival = Some(rival.clone());
    Some(format!("under load {} took {rival:?} at token {t} instead", loaded.names[left]))
}

/// The margins and the near-tie verdict of an explanation, from its chosen tokens and candidates
/// alone (the audit repeats it): each target's own choice against the other's, or against the
/// `rival` an answer under load took.
pub fn verdict(e: &Explanation) -> ([Option<f64>; 2], bool) {
    let lead = |own: usize| {
        let mine = e.chosen.get(own)?.as_ref()?;
        let other = match &e.rival {
            Some(rival) => rival,
            None => &e.chosen.get(1 - own)?.as_ref()?.token,
        };
        let rival = e.candidates.get(own)?.iter().find(|c| &c.token == other)?;
        Some(mine.logprob - rival.logprob)
    };
    let margins = [lead(0), lead(1)];
    let near_tie = margins.iter().all(|m| m.is_some_and(|m| m.is_finite() && m <= NEAR_TIE_NATS));
    (margins, near_tie)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn choice(token: &str, top: &[(&str, f64)]) -> TokenChoice {
        let top: Vec<Candidate> = top.iter().map(|(t, l)| Candidate { token: t.to_string(), logprob: *l }).collect();
        let chosen = top.iter().find(|c| c.token == token).cloned().unwrap();
        TokenChoice { chosen, top }
    }

    #[test]
    fn a_swapped_near_tie_is_judged_by_each_sides_own_margin() {
        let a = Ok(vec![choice("x", &[("x", -0.1)]), choice("p", &[("p", -0.6), ("q", -0.8), ("r", -3.0)])]);
        let b = Ok(vec![choice("x", &[("x", -0.1)]), choice("q", &[("q", -0.65), ("p", -0.75)])]);
        let e = explain("short", &a, &b, None);
        assert_eq!(e.token, Some(1));
        let [ma, mb] = e.margins;
        assert!((ma.unwrap() - 0.2).abs() < 1e-12 && (mb.unwrap() - 0.1).abs() < 1e-12, "{:?}", e.margins);
        assert!(e.near_tie);
        // The other's token not among a side's candidates: no margin, no near tie.
        let far = Ok(vec![choice("x", &[("x", -0.1)]), choice("s", &[("s", -0.01), ("t", -5.0)])]);
        let e = explain("short", &a, &far, None);
        assert_eq!(e.margins[1], None);
        assert!(!e.near_tie);
        // A wide lead is no near tie.
        let wide = Ok(vec![choice("x", &[("x", -0.1)]), choice("q", &[("q", -0.1), ("p", -2.0)])]);
        assert!(!explain("short", &a, &wide, None).near_tie);
    }

    #[test]
    fn answers_that_agree_when_asked_alone_or_end_sooner_say_so() {
        let a = Ok(vec![choice("x", &[("x", -0.1)])]);
        let e = explain("p", &a, &a.clone(), None);
        assert_eq!((e.token, e.near_tie), (None, false));
        assert!(e.note.unwrap().contains("same answer"));
        let longer = Ok(vec![choice("x", &[("x", -0.1)]), choice("y", &[("y", -0.2)])]);
        let e = explain("p", &a, &longer, None);
        assert_eq!((e.token, e.margins, e.near_tie), (Some(1), [None, None], false));
        assert!(e.note.unwrap().contains("ended after 1"));
        let e = explain("p", &Err("HTTP 400".into()), &a, None);
        assert!(e.note.unwrap().contains("HTTP 400"));
    }

    #[test]
    fn answers_alike_alone_are_judged_where_one_under_load_left_them() {
        let alone = |second: f64| {
            Ok(vec![
                choice("ab", &[("ab", -0.1)]),
                choice("cd", &[("cd", -0.5), ("cx", second), ("z", -4.0)]),
                choice("e", &[("e", -0.2)]),
            ])
        };
        let (a, b) = (alone(-0.7), alone(-0.8));
        // Under load the second target wrote "abcxq": it left at character 3, in token 1.
        let loaded = Parted { names: ["one", "two"], texts: ["abcde", "abcxq"], first_char: 3 };
        let e = explain("p", &a, &b, Some(loaded));
        assert_eq!((e.token, e.rival.as_deref()), (Some(1), Some("cx")));
        let [ma, mb] = e.margins;
        assert!((ma.unwrap() - 0.2).abs() < 1e-12 && (mb.unwrap() - 0.3).abs() < 1e-12, "{:?}", e.margins);
        assert!(e.near_tie && e.note.as_deref().unwrap().contains("under load two took \"cx\" at token 1"), "{e:?}");
        // A token taken that neither target lists: said, and no verdict.
        let far = Parted { texts: ["abcde", "abcyq"], ..loaded };
        let e = explain("p", &a, &b, Some(far));
        assert_eq!((e.token, e.near_tie), (None, false));
        // Neither recorded answer is the probe's: nothing to judge.
        let neither = Parted { texts: ["abcxq", "abcyq"], ..loaded };
        assert_eq!(explain("p", &a, &b, Some(neither)).token, None);
    }

    #[test]
    fn the_first_difference_counts_characters_not_bytes() {
        assert_eq!(first_difference("héllo", "hélp"), 3);
        assert_eq!(first_difference("abc", "abcdef"), 3);
        assert_eq!(first_difference("", "a"), 0);
    }
}

#[cfg(test)]
mod record_tests {
    use super::super::output_inconsistency;
    use super::super::summary::tests::rec;
    use super::*;

    #[test]
    fn a_length_finish_short_of_the_cap_and_a_stop_string_in_the_text_are_inconsistent() {
        let mut r = rec(0, 0.0, 0.1, 1.0, 5);
        r.max_tokens = Some(8);
        let why = output_inconsistency(&r, Some("abc"), &[]).unwrap();
        assert!(why.contains("after 5 tokens") && why.contains("max_tokens 8"), "{why}");
        r.max_tokens = Some(5);
        assert_eq!(output_inconsistency(&r, Some("abc"), &[]), None);
        // A chunk count is only a lower bound: not judged.
        r.max_tokens = Some(8);
        r.usage_completion_tokens = None;
        assert_eq!(output_inconsistency(&r, Some("abc"), &[]), None);
        r.finish_reason = Some("stop".into());
        let why = output_inconsistency(&r, Some("héllo END more"), &["END".into()]).unwrap();
        assert!(why.contains("at character 6") && why.contains("finish_reason stop"), "{why}");
        assert_eq!(output_inconsistency(&r, Some("héllo"), &["END".into()]), None);
        // No text kept: the stop strings are not judged; a failure is never judged.
        assert_eq!(output_inconsistency(&r, None, &["END".into()]), None);
        r.error = Some(super::super::ErrorClass::TruncatedStream);
        assert_eq!(output_inconsistency(&r, Some("END"), &["END".into()]), None);
    }

    #[test]
    fn targets_pair_request_by_request_and_differences_say_where() {
        let target = |name: &str| Runtime {
            name: name.into(),
            kind: super::super::Kind::OpenAi,
            base_url: "http://127.0.0.1:1".into(),
            model: "m".into(),
            replicas: Vec::new(),
        };
        let answer = |runtime: &str, index: usize, text: &str| {
            let mut r = rec(0, 0.0, 0.1, 1.0, 3);
            (r.runtime, r.index) = (runtime.into(), index);
            r.text_sha256 = Some(common::digest::bytes_digest(text.as_bytes(), common::digest::Algorithm::Sha256));
            r.text = Some(text.into());
            r
        };
        let mut failed = answer("b", 2, "x");
        failed.error = Some(super::super::ErrorClass::IdleTimeout);
        let records = vec![
            answer("a", 0, "same"),
            answer("a", 1, "abcd"),
            answer("a", 2, "x"),
            answer("b", 0, "same"),
            answer("b", 1, "abXd"),
            failed,
        ];
        let pairs = compare(&[target("a"), target("b"), target("c")], &records);
        assert_eq!(pairs.len(), 3, "every pair of targets");
        let ab = &pairs[0];
        assert_eq!((ab.compared, ab.identical, ab.share), (2, 1, Some(0.5)), "a failure pairs with nothing");
        assert_eq!((ab.differences[0].index, ab.differences[0].first_char), (1, 2));
        assert_eq!(differing_prompts(ab), vec!["short".to_string()]);
        assert_eq!((pairs[1].compared, pairs[1].share), (0, None));
    }
}
