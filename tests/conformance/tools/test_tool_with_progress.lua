-- Conformance fixture (scenario tools-call-with-progress): progress 0, 50 and 100 of 100, about
-- 50 ms apart, then a text result. The suite wants at least 3 notifications/progress before the
-- response, in non-decreasing order, each echoing the request's progressToken exactly (0.1.16
-- sends the JSON-RPC id as a number, 0.2.0-alpha the string "progress-test-1").

tool = {
    name = "test_tool_with_progress",
    description = "Reports progress three times, then answers (MCP conformance fixture).",
    annotations = { read_only = true, idempotent = true, open_world = false },
}

function tool.execute()
    progress(0, 100, "started")
    sleep(0.05)
    progress(50, 100, "halfway")
    sleep(0.05)
    progress(100, 100, "done")
    return MCP.text("Progress test completed")
end
