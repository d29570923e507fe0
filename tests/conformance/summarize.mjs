// Summarises one conformance run for tests/conformance/run.sh: one line
//   <label>: N passed, M failed, K not applicable
// then a line per failed check, warning and stale baseline entry. Exits 1 when an applicable
// scenario failed, when the suite did not finish, when a scenario the --must-pass list names for
// this label did not pass (so the pass count cannot fall, to 0 or by one, unnoticed), or (with
// --strict-baseline) when a baseline entry now passes or a passing scenario is not on that list.
//
//   node summarize.mjs --label L --results DIR --log FILE [--baseline FILE] [--exit-codes FILE]
//                      [--must-pass FILE] [--expect-summary] [--suite-exit N] [--strict-baseline]
//
// Sources, in order: the suite's "=== SUMMARY ===" lines in the log (every scenario a suite run
// attempted, even one that crashed before writing results), the checks.json files under
// DIR/server-<scenario>-<timestamp>/ (the check details), and for single-scenario runs a file of
// "<scenario> <exit code>" lines. A scenario counts as failed when any check is FAILURE; WARNING
// is reported but passes. Scenarios listed in the baseline are "not applicable" whatever happens.
// A scenario whose checks are all SKIPPED or INFO proved nothing: it is "not applicable", and
// failed when the --must-pass list names it.

import { existsSync, readdirSync, readFileSync } from 'node:fs';
import path from 'node:path';

function parseArgs(argv) {
  const args = { strictBaseline: false, expectSummary: false };
  for (let i = 0; i < argv.length; i++) {
    const flag = argv[i];
    const value = () => {
      if (i + 1 >= argv.length) usage(`${flag} needs a value`);
      return argv[++i];
    };
    switch (flag) {
      case '--label': args.label = value(); break;
      case '--results': args.results = value(); break;
      case '--log': args.log = value(); break;
      case '--baseline': args.baseline = value(); break;
      case '--exit-codes': args.exitCodes = value(); break;
      case '--must-pass': args.mustPass = value(); break;
      case '--suite-exit': args.suiteExit = Number(value()); break;
      case '--expect-summary': args.expectSummary = true; break;
      case '--strict-baseline': args.strictBaseline = true; break;
      default: usage(`unknown argument ${flag}`);
    }
  }
  if (!args.label || !args.results || !args.log) usage('--label, --results and --log are required');
  return args;
}

function usage(message) {
  console.error(`summarize.mjs: ${message}`);
  process.exit(2);
}

/** The `server:` entries of a baseline YAML (`  - name  # comment` lines). */
function readBaseline(file) {
  const names = new Set();
  if (!file) return names;
  let inServer = false;
  for (const line of readFileSync(file, 'utf8').split('\n')) {
    if (/^\S/.test(line) && !line.startsWith('#')) inServer = /^server:\s*(#.*)?$/.test(line);
    const entry = line.match(/^\s+-\s+([^\s#]+)/);
    if (inServer && entry) names.add(entry[1].replace(/^['"]|['"]$/g, ''));
  }
  return names;
}

/** The scenarios listed under `[label]` in a must-pass file; null when it has no such section. */
function readMustPass(file, label) {
  if (!file) return null;
  let names = null;
  let inSection = false;
  for (const raw of readFileSync(file, 'utf8').split('\n')) {
    const line = raw.replace(/#.*/, '').trim();
    const header = line.match(/^\[(.+)\]$/);
    if (header) {
      inSection = header[1] === label;
      if (inSection) names = new Set();
    } else if (inSection && line) {
      names.add(line);
    }
  }
  return names;
}

/** scenario -> checks, from DIR/server-<scenario>-<ISO timestamp>/checks.json. */
function readResults(dir) {
  const byScenario = new Map();
  if (!existsSync(dir)) return byScenario;
  for (const entry of readdirSync(dir, { withFileTypes: true })) {
    const match = entry.isDirectory() && entry.name.match(/^server-(.+)-\d{4}-\d{2}-\d{2}T[\d-]+Z$/);
    const file = match && path.join(dir, entry.name, 'checks.json');
    if (!file || !existsSync(file)) continue;
    let checks;
    try {
      checks = JSON.parse(readFileSync(file, 'utf8'));
    } catch (error) {
      checks = [{ id: 'checks.json', status: 'FAILURE', errorMessage: `unreadable ${file}: ${error.message}` }];
    }
    byScenario.set(match[1], [...(byScenario.get(match[1]) ?? []), ...(Array.isArray(checks) ? checks : [])]);
  }
  return byScenario;
}

/** scenario -> failed check count, from the suite's SUMMARY; null when the log has none. */
function readSummary(log) {
  const text = existsSync(log) ? readFileSync(log, 'utf8') : '';
  const at = text.lastIndexOf('=== SUMMARY ===');
  if (at === -1) return null;
  const summary = new Map();
  for (const line of text.slice(at).split('\n')) {
    const match = line.match(/^\s*[✓✗]\s+(\S+):\s+(\d+) passed, (\d+) failed/);
    if (match) summary.set(match[1], Number(match[3]));
  }
  return summary;
}

/** scenario -> exit code, from "<scenario> <code>" lines. */
function readExitCodes(file) {
  const codes = new Map();
  if (!file || !existsSync(file)) return codes;
  for (const line of readFileSync(file, 'utf8').split('\n')) {
    const [scenario, code] = line.trim().split(/\s+/);
    if (scenario && code !== undefined) codes.set(scenario, Number(code));
  }
  return codes;
}

const oneLine = (text) => String(text ?? '').replace(/\s+/g, ' ').trim().slice(0, 300);

function main() {
  const args = parseArgs(process.argv.slice(2));
  const baseline = readBaseline(args.baseline);
  const results = readResults(args.results);
  const summary = readSummary(args.log);
  const exitCodes = readExitCodes(args.exitCodes);
  const scenarios = new Set([...(summary?.keys() ?? []), ...results.keys(), ...exitCodes.keys()]);

  const mustPass = readMustPass(args.mustPass, args.label);
  const passedNames = new Set();
  let passed = 0;
  let notApplicable = 0;
  const failed = [];
  const details = [];
  const stale = [];
  for (const scenario of [...scenarios].sort()) {
    const checks = results.get(scenario) ?? [];
    const failures = checks.filter((c) => c.status === 'FAILURE');
    const warnings = checks.filter((c) => c.status === 'WARNING');
    const skipped = checks.length > 0 && checks.every((c) => c.status === 'SKIPPED' || c.status === 'INFO');
    const summaryFailed = (summary?.get(scenario) ?? 0) > 0;
    const exitCode = exitCodes.get(scenario);
    const crashed = exitCode !== undefined && exitCode !== 0 && failures.length === 0;
    const isFailed = failures.length > 0 || summaryFailed || crashed;
    if (baseline.has(scenario)) {
      notApplicable += 1;
      if (!isFailed && warnings.length === 0 && checks.length > 0) stale.push(scenario);
      continue;
    }
    if (exitCode === 0 && checks.length === 0) {
      // A single-scenario run that printed SKIPPED: not applicable at that protocol version.
      notApplicable += 1;
      details.push(`  - ${scenario}: skipped by the suite at this protocol version`);
      continue;
    }
    if (skipped && !isFailed) {
      if (mustPass?.has(scenario)) {
        failed.push(scenario);
        details.push(`  ✗ ${scenario}: only SKIPPED/INFO checks, but it must pass (${path.basename(args.mustPass)})`);
      } else {
        notApplicable += 1;
        details.push(`  - ${scenario}: only SKIPPED/INFO checks, not applicable`);
      }
      continue;
    }
    if (isFailed) {
      failed.push(scenario);
      for (const check of failures) {
        details.push(`  ✗ ${scenario} [${check.id}]: ${oneLine(check.errorMessage ?? check.description)}`);
      }
      if (failures.length === 0) {
        details.push(`  ✗ ${scenario}: ${crashed ? `exited ${exitCode} without` : 'failed in the suite summary, no'} checks.json; see ${args.log}`);
      }
    } else {
      passed += 1;
      passedNames.add(scenario);
    }
    for (const check of warnings) {
      details.push(`  ! ${scenario} [${check.id}] warning: ${oneLine(check.errorMessage ?? check.description)}`);
    }
  }

  const problems = [];
  if (scenarios.size === 0) problems.push(`no scenario ran; see ${args.log}`);
  if (args.expectSummary && summary === null) problems.push(`the suite did not finish (no SUMMARY in ${args.log})`);
  const absent = [...baseline].filter((s) => !scenarios.has(s));
  if (absent.length > 0 && summary !== null) {
    details.push(`  note: baseline entries this run did not include: ${absent.join(', ')}`);
  }
  if (stale.length > 0) {
    const line = `baseline entries that now pass (remove them from ${path.basename(args.baseline)}): ${stale.join(', ')}`;
    if (args.strictBaseline) problems.push(line);
    else details.push(`  note: ${line}`);
  }
  if (args.mustPass) {
    const file = path.basename(args.mustPass);
    if (mustPass === null) {
      problems.push(`${file} has no [${args.label}] section: list the scenarios this run must pass`);
    } else {
      for (const scenario of [...mustPass].sort()) {
        if (passedNames.has(scenario)) continue;
        const why = failed.includes(scenario) ? 'failed' : scenarios.has(scenario) ? 'was not applicable' : 'did not run';
        problems.push(`${scenario} must pass (${file}) but ${why}`);
      }
      const unlisted = [...passedNames].filter((s) => !mustPass.has(s)).sort();
      if (unlisted.length > 0) {
        const line = `passing scenarios not in ${file} [${args.label}] (add them): ${unlisted.join(', ')}`;
        if (args.strictBaseline) problems.push(line);
        else details.push(`  note: ${line}`);
      }
    }
  }
  if (args.suiteExit !== undefined && args.suiteExit !== 0 && failed.length === 0 && problems.length === 0) {
    details.push(`  note: the suite itself exited ${args.suiteExit} (stale baseline entries or warnings count there); see ${args.log}`);
  }

  console.log(`${args.label}: ${passed} passed, ${failed.length} failed, ${notApplicable} not applicable`);
  for (const line of details) console.log(line);
  for (const problem of problems) console.log(`  ✗ ${problem}`);
  process.exit(failed.length > 0 || problems.length > 0 ? 1 : 0);
}

main();
