use super::*;

#[test]
fn sampling_goes_in_each_apis_place_and_the_extra_body_on_top() {
    let sampling = crate::record::Sampling {
        temperature: Some(0.7),
        top_k: Some(-1),
        stop: vec!["END".into()],
        extra_body: Some(serde_json::from_str(r#"{"repetition_penalty": 1.1}"#).unwrap()),
        ..Default::default()
    };
    let options = RequestOptions { sampling: std::sync::Arc::new(sampling), ..Default::default() };
    let spec = Spec {
        concurrency: 1,
        round: 0,
        index: 0,
        prompt_name: "p",
        prompt: "hi",
        messages: None,
        max_tokens: 5,
        seed: 9,
        options,
    };
    let target = |kind| Runtime {
        name: "t".into(),
        kind,
        base_url: "http://127.0.0.1:1".into(),
        model: "m".into(),
        replicas: Vec::new(),
    };
    let (_, openai) = request_body(&target(Kind::OpenAi), &spec);
    assert_eq!(
        (&openai["temperature"], &openai["top_k"], &openai["stop"], &openai["seed"]),
        (&json!(0.7), &json!(-1), &json!(["END"]), &json!(9))
    );
    assert_eq!(openai["repetition_penalty"], json!(1.1));
    assert!(openai.get("top_p").is_none() && openai.get("min_p").is_none(), "unset settings are not sent");
    let (_, ollama) = request_body(&target(Kind::Ollama), &spec);
    let o = &ollama["options"];
    assert_eq!(
        (&o["temperature"], &o["top_k"], &o["stop"], &o["num_predict"]),
        (&json!(0.7), &json!(-1), &json!(["END"]), &json!(5))
    );
    assert_eq!(ollama["repetition_penalty"], json!(1.1));
    // Nothing set: greedy, as every run before the flags.
    let spec = Spec { options: RequestOptions::default(), ..spec };
    assert_eq!(request_body(&target(Kind::OpenAi), &spec).1["temperature"], json!(0.0));
}

#[test]
fn both_of_openais_logprob_shapes_read_as_the_same_tokens() {
    let chat = json!({"content": [
        {"token": "a", "logprob": -0.1, "top_logprobs": [{"token": "a", "logprob": -0.1}, {"token": "b", "logprob": -2.5}]},
        {"token": " c", "logprob": -0.5, "top_logprobs": [{"token": " c", "logprob": -0.5}]}
    ]});
    let legacy = json!({"tokens": ["a", " c"], "token_logprobs": [-0.1, -0.5],
        "top_logprobs": [{"b": -2.5, "a": -0.1}, {" c": -0.5}], "text_offset": [0, 1]});
    let read = token_choices(&chat).unwrap();
    assert_eq!(read, token_choices(&legacy).unwrap());
    assert_eq!((read[0].top[1].token.as_str(), read[1].chosen.logprob), ("b", -0.5));
    assert_eq!(token_choices(&json!({"tokens": ["a"], "token_logprobs": [], "top_logprobs": []})), None);
    assert_eq!(token_choices(&json!({"content": [{"token": "a"}]})), None);
    assert_eq!(token_choices(&Value::Null), None);
}

#[test]
fn a_group_follows_the_last_at_of_a_url_with_a_host() {
    assert_eq!(split_group("http://10.0.0.1:8000@prod"), ("http://10.0.0.1:8000", Some("prod")));
    assert_eq!(split_group("http://u:pw@10.0.0.1:8000@prod-2"), ("http://u:pw@10.0.0.1:8000", Some("prod-2")));
    assert_eq!(split_group("http://u:pw@10.0.0.1:8000"), ("http://u:pw@10.0.0.1:8000", None));
    assert_eq!(split_group("http://u:pw@localhost"), ("http://u:pw@localhost", None));
    assert_eq!(split_group("http://10.0.0.1:8000/v1"), ("http://10.0.0.1:8000/v1", None));
    assert_eq!(split_group("embedded"), ("embedded", None));
}
