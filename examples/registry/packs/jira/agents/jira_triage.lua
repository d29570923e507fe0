-- jira-triage: a prompt that triages a bug report with the pack's tools: look for duplicates
-- with jira-search, check the knowledge base, and only then file with jira-create.
agent = {
    name = "jira-triage",
    description = "Triage a bug report: search Jira for duplicates and the docs for known fixes, then file it if it is new.",
    tools = { "jira-search", "jira-create", "search" },
    arguments = {
        { name = "report", description = "The bug report, as the user wrote it", required = true },
    },
}

function agent.resolve(args, config, context)
    local project = (config.project and config.project ~= "") and config.project or "ENG"
    local system = "You triage bug reports for Jira project " .. project .. ". First call jira-search with a JQL "
        .. "text query built from the report's key words to find duplicates; if one matches, link it and stop. "
        .. "Then call search to look for a runbook or known fix. File a new issue with jira-create only when "
        .. "nothing matches, and only after the user confirms the summary."
    return { system = system, messages = { { role = "user", content = args.report } } }
end
