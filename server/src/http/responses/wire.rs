//! The Responses API's output on the wire: one typed definition per
//! object, and [`Output`], which turns an answer's pieces into the output
//! items and, for a stream, the events that build them.

use lamina_chat::{Piece, ToolCall};
use lamina_engine::{FinishReason, Summary};
use serde::Serialize;
use serde_json::Value;

/// A response object (`"object": "response"`).
#[derive(Debug, Clone, Serialize)]
pub struct ResponseObject {
    pub id: String,
    pub object: &'static str,
    pub created_at: u64,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub completed_at: Option<u64>,
    /// `in_progress`, `completed` or `incomplete`.
    pub status: &'static str,
    pub incomplete_details: Option<IncompleteDetails>,
    pub error: Option<Value>,
    pub model: String,
    pub instructions: Option<String>,
    pub max_output_tokens: Option<usize>,
    pub temperature: f32,
    pub top_p: f32,
    pub tools: Vec<Value>,
    pub tool_choice: Value,
    pub parallel_tool_calls: bool,
    pub previous_response_id: Option<String>,
    pub store: bool,
    pub output: Vec<OutputItem>,
    pub usage: Option<Usage>,
}

#[derive(Debug, Clone, Serialize)]
pub struct IncompleteDetails {
    pub reason: &'static str,
}

#[derive(Debug, Clone, Serialize)]
pub struct Usage {
    pub input_tokens: usize,
    pub input_tokens_details: InputTokensDetails,
    pub output_tokens: usize,
    pub output_tokens_details: OutputTokensDetails,
    pub total_tokens: usize,
}

#[derive(Debug, Clone, Serialize)]
pub struct InputTokensDetails {
    pub cached_tokens: usize,
}

#[derive(Debug, Clone, Serialize)]
pub struct OutputTokensDetails {
    /// Not counted apart: the engine counts tokens, not where they went.
    pub reasoning_tokens: usize,
}

impl Usage {
    pub fn of(s: &Summary) -> Usage {
        Usage {
            input_tokens: s.prompt_tokens,
            input_tokens_details: InputTokensDetails {
                cached_tokens: s.timings.cache_n,
            },
            output_tokens: s.completion_tokens,
            output_tokens_details: OutputTokensDetails {
                reasoning_tokens: 0,
            },
            total_tokens: s.prompt_tokens + s.completion_tokens,
        }
    }
}

/// An item of `output`.
#[derive(Debug, Clone, Serialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum OutputItem {
    Message {
        id: String,
        status: &'static str,
        role: &'static str,
        content: Vec<OutputText>,
    },
    FunctionCall {
        id: String,
        status: &'static str,
        call_id: String,
        name: String,
        arguments: String,
    },
    Reasoning {
        id: String,
        status: &'static str,
        summary: Vec<Value>,
        content: Vec<ReasoningText>,
    },
}

/// A message's text part (`"type": "output_text"`).
#[derive(Debug, Clone, Serialize)]
pub struct OutputText {
    #[serde(rename = "type")]
    pub kind: &'static str,
    pub text: String,
    pub annotations: Vec<Value>,
    pub logprobs: Vec<Value>,
}

impl OutputText {
    fn new(text: String) -> Self {
        OutputText {
            kind: "output_text",
            text,
            annotations: Vec::new(),
            logprobs: Vec::new(),
        }
    }
}

/// A reasoning item's text (`"type": "reasoning_text"`).
#[derive(Debug, Clone, Serialize)]
pub struct ReasoningText {
    #[serde(rename = "type")]
    pub kind: &'static str,
    pub text: String,
}

/// A streamed event; `type` names it, and the SSE `event:` line repeats it.
#[derive(Debug, Clone, Serialize)]
#[serde(tag = "type")]
pub enum StreamEvent {
    #[serde(rename = "response.created")]
    Created {
        sequence_number: u64,
        response: ResponseObject,
    },
    #[serde(rename = "response.in_progress")]
    InProgress {
        sequence_number: u64,
        response: ResponseObject,
    },
    #[serde(rename = "response.output_item.added")]
    ItemAdded {
        sequence_number: u64,
        output_index: usize,
        item: OutputItem,
    },
    #[serde(rename = "response.output_item.done")]
    ItemDone {
        sequence_number: u64,
        output_index: usize,
        item: OutputItem,
    },
    #[serde(rename = "response.content_part.added")]
    PartAdded {
        sequence_number: u64,
        item_id: String,
        output_index: usize,
        content_index: usize,
        part: OutputText,
    },
    #[serde(rename = "response.content_part.done")]
    PartDone {
        sequence_number: u64,
        item_id: String,
        output_index: usize,
        content_index: usize,
        part: OutputText,
    },
    #[serde(rename = "response.output_text.delta")]
    TextDelta {
        sequence_number: u64,
        item_id: String,
        output_index: usize,
        content_index: usize,
        delta: String,
        logprobs: Vec<Value>,
    },
    #[serde(rename = "response.output_text.done")]
    TextDone {
        sequence_number: u64,
        item_id: String,
        output_index: usize,
        content_index: usize,
        text: String,
        logprobs: Vec<Value>,
    },
    #[serde(rename = "response.reasoning_text.delta")]
    ReasoningDelta {
        sequence_number: u64,
        item_id: String,
        output_index: usize,
        content_index: usize,
        delta: String,
    },
    #[serde(rename = "response.reasoning_text.done")]
    ReasoningDone {
        sequence_number: u64,
        item_id: String,
        output_index: usize,
        content_index: usize,
        text: String,
    },
    #[serde(rename = "response.function_call_arguments.delta")]
    ArgumentsDelta {
        sequence_number: u64,
        item_id: String,
        output_index: usize,
        delta: String,
    },
    #[serde(rename = "response.function_call_arguments.done")]
    ArgumentsDone {
        sequence_number: u64,
        item_id: String,
        output_index: usize,
        name: String,
        arguments: String,
    },
    #[serde(rename = "response.completed")]
    Completed {
        sequence_number: u64,
        response: ResponseObject,
    },
    #[serde(rename = "response.incomplete")]
    Incomplete {
        sequence_number: u64,
        response: ResponseObject,
    },
}

impl StreamEvent {
    /// The event's `type`, for the SSE `event:` line.
    pub fn name(&self) -> &'static str {
        match self {
            StreamEvent::Created { .. } => "response.created",
            StreamEvent::InProgress { .. } => "response.in_progress",
            StreamEvent::ItemAdded { .. } => "response.output_item.added",
            StreamEvent::ItemDone { .. } => "response.output_item.done",
            StreamEvent::PartAdded { .. } => "response.content_part.added",
            StreamEvent::PartDone { .. } => "response.content_part.done",
            StreamEvent::TextDelta { .. } => "response.output_text.delta",
            StreamEvent::TextDone { .. } => "response.output_text.done",
            StreamEvent::ReasoningDelta { .. } => "response.reasoning_text.delta",
            StreamEvent::ReasoningDone { .. } => "response.reasoning_text.done",
            StreamEvent::ArgumentsDelta { .. } => "response.function_call_arguments.delta",
            StreamEvent::ArgumentsDone { .. } => "response.function_call_arguments.done",
            StreamEvent::Completed { .. } => "response.completed",
            StreamEvent::Incomplete { .. } => "response.incomplete",
        }
    }
}

/// What is open at the end of `output`.
#[derive(Debug)]
enum Open {
    Nothing,
    Reasoning { id: String, text: String },
    Message { id: String, text: String },
}

/// The output of one answer, built piece by piece: the items, and the
/// events a stream sends for them. Reasoning and text that follow each
/// other extend the open item; a call, or a change of kind, closes it.
#[derive(Debug)]
pub struct Output {
    pub items: Vec<OutputItem>,
    open: Open,
    pub events: Vec<StreamEvent>,
    seq: u64,
}

impl Output {
    pub fn new() -> Self {
        Output {
            items: Vec::new(),
            open: Open::Nothing,
            events: Vec::new(),
            seq: 0,
        }
    }

    /// The next event's sequence number.
    pub fn seq(&mut self) -> u64 {
        let n = self.seq;
        self.seq += 1;
        n
    }

    pub fn piece(&mut self, p: Piece) {
        match p {
            Piece::Reasoning(t) => self.reasoning(t),
            Piece::Text(t) => self.text(t),
            Piece::Call(c) => self.call(&c),
        }
    }

    fn reasoning(&mut self, delta: String) {
        if !matches!(self.open, Open::Reasoning { .. }) {
            self.close();
            let id = format!("rs_{}", super::super::random_id());
            let sequence_number = self.seq();
            self.events.push(StreamEvent::ItemAdded {
                sequence_number,
                output_index: self.items.len(),
                item: OutputItem::Reasoning {
                    id: id.clone(),
                    status: "in_progress",
                    summary: Vec::new(),
                    content: Vec::new(),
                },
            });
            self.open = Open::Reasoning {
                id,
                text: String::new(),
            };
        }
        let sequence_number = self.seq();
        let output_index = self.items.len();
        if let Open::Reasoning { id, text } = &mut self.open {
            text.push_str(&delta);
            self.events.push(StreamEvent::ReasoningDelta {
                sequence_number,
                item_id: id.clone(),
                output_index,
                content_index: 0,
                delta,
            });
        }
    }

    fn text(&mut self, delta: String) {
        if !matches!(self.open, Open::Message { .. }) {
            self.close();
            let id = format!("msg_{}", super::super::random_id());
            let output_index = self.items.len();
            let sequence_number = self.seq();
            self.events.push(StreamEvent::ItemAdded {
                sequence_number,
                output_index,
                item: OutputItem::Message {
                    id: id.clone(),
                    status: "in_progress",
                    role: "assistant",
                    content: Vec::new(),
                },
            });
            let sequence_number = self.seq();
            self.events.push(StreamEvent::PartAdded {
                sequence_number,
                item_id: id.clone(),
                output_index,
                content_index: 0,
                part: OutputText::new(String::new()),
            });
            self.open = Open::Message {
                id,
                text: String::new(),
            };
        }
        let sequence_number = self.seq();
        let output_index = self.items.len();
        if let Open::Message { id, text } = &mut self.open {
            text.push_str(&delta);
            self.events.push(StreamEvent::TextDelta {
                sequence_number,
                item_id: id.clone(),
                output_index,
                content_index: 0,
                delta,
                logprobs: Vec::new(),
            });
        }
    }

    fn call(&mut self, call: &ToolCall) {
        self.close();
        let call_id = super::super::tools::call_id(call);
        let id = format!("fc_{}", super::super::random_id());
        let arguments = call.arguments_json();
        let output_index = self.items.len();
        let item = |status, arguments: &str| OutputItem::FunctionCall {
            id: id.clone(),
            status,
            call_id: call_id.clone(),
            name: call.name.clone(),
            arguments: arguments.to_owned(),
        };
        let added = item("in_progress", "");
        let done = item("completed", &arguments);
        let s = self.seq();
        self.events.push(StreamEvent::ItemAdded {
            sequence_number: s,
            output_index,
            item: added,
        });
        let s = self.seq();
        self.events.push(StreamEvent::ArgumentsDelta {
            sequence_number: s,
            item_id: id.clone(),
            output_index,
            delta: arguments.clone(),
        });
        let s = self.seq();
        self.events.push(StreamEvent::ArgumentsDone {
            sequence_number: s,
            item_id: id.clone(),
            output_index,
            name: call.name.clone(),
            arguments,
        });
        let s = self.seq();
        self.events.push(StreamEvent::ItemDone {
            sequence_number: s,
            output_index,
            item: done.clone(),
        });
        self.items.push(done);
    }

    /// Closes the open item, with its `…done` events.
    pub fn close(&mut self) {
        let output_index = self.items.len();
        match std::mem::replace(&mut self.open, Open::Nothing) {
            Open::Nothing => {}
            Open::Reasoning { id, text } => {
                let s = self.seq();
                self.events.push(StreamEvent::ReasoningDone {
                    sequence_number: s,
                    item_id: id.clone(),
                    output_index,
                    content_index: 0,
                    text: text.clone(),
                });
                let item = OutputItem::Reasoning {
                    id,
                    status: "completed",
                    summary: Vec::new(),
                    content: vec![ReasoningText {
                        kind: "reasoning_text",
                        text,
                    }],
                };
                let s = self.seq();
                self.events.push(StreamEvent::ItemDone {
                    sequence_number: s,
                    output_index,
                    item: item.clone(),
                });
                self.items.push(item);
            }
            Open::Message { id, text } => {
                let s = self.seq();
                self.events.push(StreamEvent::TextDone {
                    sequence_number: s,
                    item_id: id.clone(),
                    output_index,
                    content_index: 0,
                    text: text.clone(),
                    logprobs: Vec::new(),
                });
                let part = OutputText::new(text);
                let s = self.seq();
                self.events.push(StreamEvent::PartDone {
                    sequence_number: s,
                    item_id: id.clone(),
                    output_index,
                    content_index: 0,
                    part: part.clone(),
                });
                let item = OutputItem::Message {
                    id,
                    status: "completed",
                    role: "assistant",
                    content: vec![part],
                };
                let s = self.seq();
                self.events.push(StreamEvent::ItemDone {
                    sequence_number: s,
                    output_index,
                    item: item.clone(),
                });
                self.items.push(item);
            }
        }
    }

    /// The events built so far, taken.
    pub fn take_events(&mut self) -> Vec<StreamEvent> {
        std::mem::take(&mut self.events)
    }
}

/// `completed`, or `incomplete` (and why) when the output limit or the
/// context cut the answer.
pub fn status(finish: FinishReason) -> (&'static str, Option<IncompleteDetails>) {
    match finish {
        FinishReason::Stop => ("completed", None),
        FinishReason::Length => (
            "incomplete",
            Some(IncompleteDetails {
                reason: "max_output_tokens",
            }),
        ),
    }
}
