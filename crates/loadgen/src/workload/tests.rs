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
    supply::generate::generate_into(&supply::generate::shape("tiny").unwrap(), &dir, false).unwrap();
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
        assert!(SharedPrefix::parse(bad).unwrap_err().to_string().contains("GROUPS:PROMPTS:PREFIX:QUESTION"), "{bad}");
    }
}

#[test]
fn conversations_come_from_jsonl_or_sharegpt_and_a_bad_line_is_named() {
    let tmp = tempfile::tempdir().unwrap();
    let path = tmp.path().join("c.jsonl");
    std::fs::write(
        &path,
        "{\"turns\": [\"hi\", \"and then?\"], \"system\": \"be brief\", \"max_tokens\": 5}\n\n{\"turns\": [\"one turn\"]}\n",
    )
    .unwrap();
    let w = Workload::conversations(&path, "c.jsonl").unwrap();
    assert_eq!(w.items.len(), 2);
    let first = &w.items[0];
    assert_eq!((first.name.as_str(), first.turns(), first.max_tokens), ("line-1", 2, Some(5)));
    assert_eq!(first.messages.as_ref().unwrap()[0], serde_json::json!({"role": "system", "content": "be brief"}));
    assert_eq!(first.messages.as_ref().unwrap()[1], serde_json::json!({"role": "user", "content": "hi"}));
    assert_eq!(first.follow_ups, ["and then?"]);
    assert_eq!((w.items[1].name.as_str(), w.items[1].turns()), ("line-3", 1));
    assert_eq!((w.record.source.as_str(), w.record.conversation_turns.clone()), ("conversations", vec![2, 1]));
    // The later turns are in the digest: a changed follow-up is another workload.
    std::fs::write(&path, "{\"turns\": [\"hi\", \"and now?\"], \"system\": \"be brief\", \"max_tokens\": 5}\n{\"turns\": [\"one turn\"]}\n").unwrap();
    assert_ne!(Workload::conversations(&path, "c.jsonl").unwrap().record.items_sha256, w.record.items_sha256);
    for (line, problem) in [
        ("{\"turns\": []}", "turns is not an array"),
        ("{\"turns\": [\"a\", 3]}", "turns is not an array"),
        ("{\"turns\": [\"a\"], \"system\": 1}", "system is not a string"),
        ("{\"turns\": [\"a\"], \"max_tokens\": 0}", "max_tokens 0"),
        ("nope", "not JSON"),
    ] {
        std::fs::write(&path, format!("{{\"turns\": [\"fine\"]}}\n{line}\n")).unwrap();
        let e = Workload::conversations(&path, "c.jsonl").unwrap_err().to_string();
        assert!(e.starts_with("c.jsonl:2: ") && e.contains(problem) && e.contains("{\"turns\""), "{e}");
    }
    // A ShareGPT export: the human turns after the system prompt; the recorded replies go.
    let share = tmp.path().join("s.json");
    let conversations = serde_json::json!([
        {"conversations": [
            {"from": "system", "value": "You help."}, {"from": "human", "value": "Q1"},
            {"from": "gpt", "value": "A1"}, {"from": "human", "value": "Q2"}, {"from": "gpt", "value": "A2"}]},
        {"conversations": [{"from": "gpt", "value": "no human turn"}]},
        {"conversations": [{"from": "human", "value": "Alone"}]},
    ]);
    std::fs::write(&share, conversations.to_string()).unwrap();
    let w = Workload::conversations(&share, "s.json").unwrap();
    let shown: Vec<(&str, usize)> = w.items.iter().map(|i| (i.name.as_str(), i.turns())).collect();
    assert_eq!(shown, [("conversation-0", 2), ("conversation-2", 1)]);
    assert_eq!(w.items[0].messages.as_ref().unwrap()[0]["content"], "You help.");
    assert_eq!(w.items[0].follow_ups, ["Q2"]);
    // Exports that say user and assistant read the same.
    let roles = serde_json::json!([{"conversations": [
        {"from": "user", "value": "U1"}, {"from": "assistant", "value": "A1"}, {"from": "user", "value": "U2"}]}]);
    std::fs::write(&share, roles.to_string()).unwrap();
    let w = Workload::conversations(&share, "s.json").unwrap();
    assert_eq!((w.items[0].prompt.as_str(), w.items[0].follow_ups.clone()), ("U1", vec!["U2".to_string()]));
    // A conversation longer than a run may send is refused, not cut.
    let long: Vec<Value> =
        (0..=MAX_TURNS).map(|t| serde_json::json!({"from": "human", "value": format!("t{t}")})).collect();
    std::fs::write(&share, serde_json::json!([{"conversations": long}]).to_string()).unwrap();
    let e = Workload::conversations(&share, "s.json").unwrap_err().to_string();
    assert!(e.starts_with("s.json: conversation 0 has 1001 human turns, more than 1000"), "{e}");
    // A file with nothing to send says what it should hold.
    std::fs::write(&share, r#"[{"conversations": [{"from": "gpt", "value": "alone"}]}]"#).unwrap();
    let e = Workload::conversations(&share, "s.json").unwrap_err().to_string();
    assert!(e.starts_with("s.json: no prompts in it; a conversations file has one {\"turns\""), "{e}");
}

#[test]
fn generated_conversations_have_their_shape_and_are_drawn_from_the_seed() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("tiny");
    supply::generate::generate_into(&supply::generate::shape("tiny").unwrap(), &dir, false).unwrap();
    let shape = MultiTurn::parse("3:4:50:8").unwrap();
    assert_eq!(shape, MultiTurn { conversations: 3, turns: 4, system: 50, question: 8 });
    let w = Workload::multi_turn(&dir, "tiny", shape, 7).unwrap();
    assert_eq!(w.items.len(), 3);
    assert!(w.items.iter().all(|i| i.turns() == 4 && i.messages.as_ref().unwrap().as_array().unwrap().len() == 2));
    let system = |i: usize| w.items[i].messages.as_ref().unwrap()[0]["content"].as_str().unwrap().to_string();
    assert_ne!(system(0), system(1), "each conversation has its own system prompt");
    let (tokenizer, _, _) = load_tokenizer(&dir, "tiny").unwrap();
    let count = |t: &str| tokenizer.encode(t, false).unwrap().get_ids().len();
    assert!((49..=51).contains(&count(&system(0))) && (7..=9).contains(&count(&w.items[0].follow_ups[2])));
    assert_eq!((w.record.source.as_str(), w.record.conversation_turns.clone()), ("multi-turn", vec![4, 4, 4]));
    assert_eq!(Workload::multi_turn(&dir, "tiny", shape, 7).unwrap().record.items_sha256, w.record.items_sha256);
    assert_ne!(Workload::multi_turn(&dir, "tiny", shape, 8).unwrap().record.items_sha256, w.record.items_sha256);
    for bad in ["1:2:3", "0:1:1:1", "1:1001:1:1", "1:1:1:x"] {
        assert!(
            MultiTurn::parse(bad).unwrap_err().to_string().contains("CONVERSATIONS:TURNS:SYSTEM:QUESTION"),
            "{bad}"
        );
    }
}
