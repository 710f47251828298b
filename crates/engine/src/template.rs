//! Chat templates: the checkpoint's own Jinja `chat_template`, rendered the way transformers'
//! `apply_chat_template(messages, add_generation_prompt=True)` renders it.
//!
//! transformers renders with `trim_blocks` and `lstrip_blocks` on and offers `raise_exception`;
//! we set up minijinja the same way so that the prompt text, and so the token ids, are identical.

use minijinja::{context, Environment, Error, ErrorKind};
use serde::Serialize;

#[derive(Debug, thiserror::Error)]
pub enum TemplateError {
    #[error("tokenizer_config.json: {0}")]
    Config(String),
    #[error("chat template failed to render: {0}")]
    Render(String),
}

/// One chat message.
#[derive(Debug, Clone, Serialize)]
pub struct Message<'a> {
    pub role: &'a str,
    pub content: &'a str,
}

/// A compiled chat template.
pub struct ChatTemplate {
    env: Environment<'static>,
}

impl ChatTemplate {
    /// Reads `chat_template` from tokenizer_config.json bytes (a string, or a list of named
    /// templates of which `default` is used) and compiles it.
    pub(crate) fn from_tokenizer_config(bytes: &[u8]) -> Result<Self, TemplateError> {
        let value: serde_json::Value =
            serde_json::from_slice(bytes).map_err(|e| TemplateError::Config(e.to_string()))?;
        let source = match value.get("chat_template") {
            Some(serde_json::Value::String(s)) => s.clone(),
            Some(serde_json::Value::Array(list)) => list
                .iter()
                .find(|t| t.get("name").and_then(|n| n.as_str()) == Some("default"))
                .and_then(|t| t.get("template").and_then(|t| t.as_str()))
                .map(str::to_string)
                .ok_or_else(|| TemplateError::Config("chat_template list has no `default` entry".into()))?,
            _ => {
                return Err(TemplateError::Config(
                    "no `chat_template` string; the checkpoint needs one to render prompts".into(),
                ))
            }
        };
        Self::new(source)
    }

    pub fn new(source: String) -> Result<Self, TemplateError> {
        let mut env = Environment::new();
        env.set_trim_blocks(true);
        env.set_lstrip_blocks(true);
        env.add_function("raise_exception", |msg: String| -> Result<String, Error> {
            Err(Error::new(ErrorKind::InvalidOperation, msg))
        });
        env.add_template_owned("chat", source).map_err(|e| TemplateError::Render(e.to_string()))?;
        Ok(ChatTemplate { env })
    }

    pub fn render(&self, messages: &[Message<'_>], add_generation_prompt: bool) -> Result<String, TemplateError> {
        let template = self.env.get_template("chat").map_err(|e| TemplateError::Render(e.to_string()))?;
        template
            .render(context! { messages => messages, add_generation_prompt => add_generation_prompt })
            .map_err(|e| TemplateError::Render(e.to_string()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn qwen_template_renders_like_transformers() {
        let t = ChatTemplate::new(supply::generate::QWEN25_CHAT_TEMPLATE.to_string()).unwrap();
        assert_eq!(
            t.render(&[Message { role: "user", content: "Name one reason to bound a request queue." }], true).unwrap(),
            "<|im_start|>system\nYou are Qwen, created by Alibaba Cloud. You are a helpful assistant.<|im_end|>\n\
             <|im_start|>user\nName one reason to bound a request queue.<|im_end|>\n<|im_start|>assistant\n"
        );
        let with_system = t
            .render(&[Message { role: "system", content: "Be brief." }, Message { role: "user", content: "Hi" }], false)
            .unwrap();
        assert_eq!(with_system, "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n");
    }

    #[test]
    fn missing_or_broken_templates_are_errors() {
        let err = ChatTemplate::from_tokenizer_config(br#"{"eos_token":"x"}"#).err().unwrap().to_string();
        assert!(err.contains("no `chat_template`"), "{err}");
        assert!(ChatTemplate::new("{% if %}".into()).is_err());
        let raising = ChatTemplate::new("{{ raise_exception('no system role') }}".into()).unwrap();
        let err = raising.render(&[Message { role: "user", content: "x" }], true).unwrap_err().to_string();
        assert!(err.contains("no system role"), "{err}");
    }
}
