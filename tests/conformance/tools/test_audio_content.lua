-- Conformance fixture (scenario tools-call-audio): one audio block. The check wants mimeType
-- exactly "audio/wav".

-- The reference server's minimal WAV, base64.
local WAV = "UklGRiYAAABXQVZFZm10IBAAAAABAAEAQB8AAAB9AAACABAAZGF0YQIAAAA="

tool = {
    name = "test_audio_content",
    description = "Returns an audio content block (MCP conformance fixture).",
    annotations = { read_only = true, idempotent = true, open_world = false },
}

function tool.execute()
    return MCP.content({
        { type = "audio", data = WAV, mimeType = "audio/wav" },
    })
end
