//! The two chat APIs' request and answer bodies: OpenAI's chat completions and Ollama's
//! `/api/chat`. They differ in small ways: OpenAI sends tool arguments as a JSON string and
//! names each call; Ollama sends an object and no id.

use serde_json::{json, Map, Value as Json};

use super::{call, parameters_for_model, Names, Offer};
use crate::types::{ChatMessage, ChatMessageRole, ChatToolCall};

fn role(role: ChatMessageRole) -> &'static str {
    match role {
        ChatMessageRole::System => "system",
        ChatMessageRole::User => "user",
        ChatMessageRole::Assistant => "assistant",
        ChatMessageRole::Tool => "tool",
    }
}

fn tools(offered: &[&Offer], names: &Names) -> Vec<Json> {
    offered
        .iter()
        .map(|t| {
            json!({"type": "function", "function": {
                "name": names.for_model(&t.name),
                "description": t.description,
                "parameters": parameters_for_model(&t.parameters),
            }})
        })
        .collect()
}

pub fn openai_request(model: &str, messages: &[ChatMessage], offered: &[&Offer], names: &Names) -> Json {
    let messages: Vec<Json> = messages
        .iter()
        .map(|m| {
            let mut out = Map::new();
            out.insert("role".into(), json!(role(m.role)));
            out.insert("content".into(), json!(m.content));
            if !m.tool_calls.is_empty() {
                let calls: Vec<Json> = m
                    .tool_calls
                    .iter()
                    .map(|c| {
                        json!({"id": c.id, "type": "function", "function": {
                            "name": names.for_model(&c.name),
                            "arguments": Json::Object(c.arguments.clone()).to_string(),
                        }})
                    })
                    .collect();
                out.insert("tool_calls".into(), Json::Array(calls));
            }
            if let Some(id) = &m.tool_call_id {
                out.insert("tool_call_id".into(), json!(id));
            }
            Json::Object(out)
        })
        .collect();
    let mut body = json!({"model": model, "messages": messages});
    let tools = tools(offered, names);
    if !tools.is_empty() {
        body["tools"] = Json::Array(tools);
    }
    body
}

pub fn openai_answer(answer: &Json, names: &Names) -> Result<ChatMessage, String> {
    let message = answer.pointer("/choices/0/message").ok_or("it has no choices[0].message")?;
    let mut calls = Vec::new();
    for (i, c) in message.get("tool_calls").and_then(Json::as_array).into_iter().flatten().enumerate() {
        let name = c.pointer("/function/name").and_then(Json::as_str).ok_or("a tool call has no function.name")?;
        let arguments = match c.pointer("/function/arguments") {
            Some(Json::String(text)) if text.trim().is_empty() => Json::Null,
            Some(Json::String(text)) => serde_json::from_str(text)
                .map_err(|e| format!("the arguments of its call of {name} are not JSON ({e})"))?,
            Some(other) => other.clone(),
            None => Json::Null,
        };
        let id = c.get("id").and_then(Json::as_str).map(str::to_string).unwrap_or_else(|| format!("call_{i}"));
        calls.push(call(id, names.for_ctx(name), arguments));
    }
    Ok(assistant(message.get("content").and_then(Json::as_str), calls))
}

pub fn ollama_request(model: &str, messages: &[ChatMessage], offered: &[&Offer], names: &Names) -> Json {
    // Ollama's tool messages carry the tool's name, not the call's id: find it from the call.
    let name_of = |id: &str| {
        messages.iter().flat_map(|m| m.tool_calls.iter()).find(|c| c.id == id).map(|c| names.for_model(&c.name))
    };
    let messages: Vec<Json> = messages
        .iter()
        .map(|m| {
            let mut out = Map::new();
            out.insert("role".into(), json!(role(m.role)));
            out.insert("content".into(), json!(m.content.clone().unwrap_or_default()));
            if !m.tool_calls.is_empty() {
                let calls: Vec<Json> = m
                    .tool_calls
                    .iter()
                    .map(|c| json!({"function": {"name": names.for_model(&c.name), "arguments": c.arguments}}))
                    .collect();
                out.insert("tool_calls".into(), Json::Array(calls));
            }
            if let Some(name) = m.tool_call_id.as_deref().and_then(name_of) {
                out.insert("tool_name".into(), json!(name));
            }
            Json::Object(out)
        })
        .collect();
    let mut body = json!({"model": model, "messages": messages, "stream": false});
    let tools = tools(offered, names);
    if !tools.is_empty() {
        body["tools"] = Json::Array(tools);
    }
    body
}

pub fn ollama_answer(answer: &Json, names: &Names) -> Result<ChatMessage, String> {
    let message = answer.get("message").ok_or("it has no message")?;
    let mut calls = Vec::new();
    for (i, c) in message.get("tool_calls").and_then(Json::as_array).into_iter().flatten().enumerate() {
        let name = c.pointer("/function/name").and_then(Json::as_str).ok_or("a tool call has no function.name")?;
        let arguments = c.pointer("/function/arguments").cloned().unwrap_or(Json::Null);
        let id = c.get("id").and_then(Json::as_str).map(str::to_string).unwrap_or_else(|| format!("call_{i}"));
        calls.push(call(id, names.for_ctx(name), arguments));
    }
    Ok(assistant(message.get("content").and_then(Json::as_str), calls))
}

fn assistant(content: Option<&str>, tool_calls: Vec<ChatToolCall>) -> ChatMessage {
    ChatMessage {
        role: ChatMessageRole::Assistant,
        content: content.filter(|c| !c.is_empty()).map(str::to_string),
        tool_calls,
        tool_call_id: None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn openai_tool_calls_map_back_to_ctx_names_with_object_arguments() {
        let names = Names::new(["a.b"].into_iter());
        let answer = json!({"choices": [{"message": {"role": "assistant", "content": null, "tool_calls": [
            {"id": "c1", "type": "function", "function": {"name": "a_b", "arguments": "{\"q\": 1}"}}
        ]}}]});
        let message = openai_answer(&answer, &names).unwrap();
        assert_eq!(message.tool_calls[0].name, "a.b");
        assert_eq!(Json::Object(message.tool_calls[0].arguments.clone()), json!({"q": 1}));
        let bad = json!({"choices": [{"message": {"tool_calls": [{"function": {"name": "a_b", "arguments": "{"}}]}}]});
        assert!(openai_answer(&bad, &names).unwrap_err().contains("not JSON"));
    }

    #[test]
    fn ollama_tool_messages_name_their_tool() {
        let names = Names::new(["search"].into_iter());
        let messages = vec![
            assistant(None, vec![call("c1".into(), "search".into(), json!({"query": "x"}))]),
            ChatMessage {
                role: ChatMessageRole::Tool,
                content: Some("[]".into()),
                tool_calls: vec![],
                tool_call_id: Some("c1".into()),
            },
        ];
        let body = ollama_request("m", &messages, &[], &names);
        assert_eq!(body["messages"][1]["tool_name"], "search");
        assert_eq!(body["messages"][0]["tool_calls"][0]["function"]["arguments"], json!({"query": "x"}));
        assert_eq!(body["stream"], false);
    }
}
