"""Remote engines: OpenAI-compatible servers elsewhere (vLLM, llama-server, a SpecChat server), with their
speculation figures. No Qt here: the window runs this code on a thread of its own."""
