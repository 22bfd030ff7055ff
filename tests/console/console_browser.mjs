// Drives the operator console in headless Chromium, step by step with the Rust test that
// started the Hosts. Protocol on stdout/stdin, one line each:
//   -> STEP <name>           a step began (for the test's log)
//   -> WANT_SESSION          the page is open on Sessions: create a session from the CLI now
//   <- <session id>          ... the session the CLI created (with a gated message sent)
//   -> WANT_RUN              start a run that asks a yes/no question, from the CLI
//   <- <run id>              ... the run the CLI started
//   -> DRAINED <report json> the drain button was pressed and its report is shown (the
//                            Hosts table then says the operator asked for it)
//   <- MOVED                 ... a message was sent to the session, which now lives elsewhere
//   -> DONE                  every check passed
// Anything wrong ends the process non-zero with the reason on stderr.
// Environment: CONSOLE_URL, CONSOLE_TOKEN, CHROMIUM (executable), SHOTS (screenshot folder).

import { chromium } from "playwright-core";
import { createInterface } from "node:readline";
import { mkdirSync } from "node:fs";

const url = process.env.CONSOLE_URL;
const token = process.env.CONSOLE_TOKEN;
const shots = process.env.SHOTS;
mkdirSync(shots, { recursive: true });

const lines = createInterface({ input: process.stdin });
const pending = [];
const waiters = [];
lines.on("line", (l) => (waiters.length ? waiters.shift()(l) : pending.push(l)));
const nextLine = () => new Promise((r) => (pending.length ? r(pending.shift()) : waiters.push(r)));
const say = (s) => process.stdout.write(s + "\n");
const step = (s) => say("STEP " + s);

const errors = [];
const browser = await chromium.launch({
  executablePath: process.env.CHROMIUM,
  headless: true,
  args: ["--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage"],
});
try {
  const context = await browser.newContext({ viewport: { width: 1280, height: 800 } });
  const page = await context.newPage();
  page.setDefaultTimeout(20000);
  page.on("pageerror", (e) => errors.push("page error: " + e.message));
  page.on("console", (m) => {
    // A refused request (the 401 before signing in, a 409 for a session resident elsewhere)
    // is logged by the browser as a resource failure, not a script error.
    if (m.type() === "error" && !m.text().startsWith("Failed to load resource")) {
      errors.push("console error: " + m.text());
    }
  });
  // A prompt (a run's answer) is given `promptAnswer`; a confirmation is accepted.
  let promptAnswer;
  page.on("dialog", (d) => d.accept(d.type() === "prompt" ? promptAnswer : undefined));

  step("login");
  await page.goto(url);
  await page.waitForSelector("#login-form", { state: "visible" });
  await page.screenshot({ path: `${shots}/01-login.png`, fullPage: true });
  await page.fill("#token", "not-an-operator-token");
  await page.click("#login-form button");
  await page.waitForSelector("#login-error:has-text('not an operator credential')");
  await page.fill("#token", token);
  await page.click("#login-form button");
  await page.waitForSelector("#hosts-table tbody tr[data-host]");
  await page.screenshot({ path: `${shots}/02-hosts.png`, fullPage: true });

  step("a session created from the CLI appears");
  await page.click("nav a[data-view=sessions]");
  await page.waitForSelector("#sessions-table thead");
  say("WANT_SESSION");
  const session = (await nextLine()).trim();
  // No reload: the page learns of it from the Host's change notice.
  await page.waitForSelector(`#sessions-table tr[data-session="${session}"]`);
  await page.screenshot({ path: `${shots}/03-sessions.png`, fullPage: true });

  step("answer the gate from the page; the tool runs once");
  await page.click(`#sessions-table tr[data-session="${session}"]`);
  await page.waitForSelector("#session-gates tr[data-gate] button[data-action=approve]");
  await page.screenshot({ path: `${shots}/04-session-gated.png`, fullPage: true });
  await page.click("#session-gates tr[data-gate] button[data-action=approve]");
  // The approved call runs, its result is journaled, and the turn ends (the second turn_done:
  // the first is the reply to the session's first message).
  await page.waitForFunction(() => {
    const items = [...document.querySelectorAll("#session-journal li")].map((li) => li.textContent);
    return items.some((t) => t.startsWith("tool_result")) &&
      items.filter((t) => t.startsWith("turn_done")).length >= 2;
  });
  await page.waitForFunction(() =>
    [...document.querySelectorAll("#session-commands tr[data-command]")]
      .some((r) => r.children[1].textContent === "gate_response" && r.children[2].textContent === "applied"));
  const toolResults = await page.$$eval("#session-journal li", (lis) =>
    lis.filter((li) => li.textContent.startsWith("tool_result")).length,
  );
  if (toolResults !== 1) throw new Error(`expected one tool_result, saw ${toolResults}`);
  const gateCommands = await page.$$eval("#session-commands tr[data-command]", (rows) =>
    rows.map((r) => [...r.children].map((td) => td.textContent)).filter((c) => c[1] === "gate_response"),
  );
  if (gateCommands.length !== 1 || gateCommands[0][4] !== "operator:admin") {
    throw new Error("the gate answer is not one command attributed to the operator: " + JSON.stringify(gateCommands));
  }
  // The CLI's commands name the actor its token stands for (an opaque token: its tenant).
  const cliCommands = await page.$$eval("#session-commands tr[data-command]", (rows) =>
    rows.map((r) => [...r.children].map((td) => td.textContent)).filter((c) => c[1] !== "gate_response"),
  );
  if (cliCommands.length === 0 || cliCommands.some((c) => c[4] !== "tenant:acme")) {
    throw new Error("the CLI's commands are not attributed to its tenant: " + JSON.stringify(cliCommands));
  }
  await page.screenshot({ path: `${shots}/05-session-answered.png`, fullPage: true });

  step("gates, runs and charts views");
  await page.click("nav a[data-view=gates]");
  await page.waitForSelector("#gates-table thead");
  await page.screenshot({ path: `${shots}/06-gates.png`, fullPage: true });

  step("a run started from the CLI: who started it, and its ask answered from the page");
  say("WANT_RUN");
  const run = (await nextLine()).trim();
  await page.click("nav a[data-view=runs]");
  await page.waitForSelector(`#runs-table tr[data-run="${run}"]`);
  await page.click(`#runs-table tr[data-run="${run}"]`);
  await page.waitForSelector("#run-started-by [data-actor]:text-is('tenant:acme')");
  // The run parks at its ask on whichever Host drives it; the page hears of the change
  // without a reload and offers the answer.
  const answer = "#run-actions button:has-text('Answer approve')";
  await page.waitForSelector(answer);
  await page.screenshot({ path: `${shots}/07-run-asking.png`, fullPage: true });
  promptAnswer = "true";
  await page.click(answer);
  await page.waitForFunction(() =>
    [...document.querySelectorAll("#run-answers tbody tr")].some((r) =>
      r.children.length === 3 && r.children[0].textContent === "approve" &&
      r.children[1].textContent === "operator:admin"));
  promptAnswer = undefined;
  await page.waitForFunction(() => document.querySelector("#run-title").textContent.includes("completed"));
  await page.screenshot({ path: `${shots}/07-run-answered.png`, fullPage: true });

  step("more runs than a page: newest first, and More reads the rest");
  say("WANT_RUNS 60");
  const newest = (await nextLine()).trim();
  // The page hears of the new runs without a reload; the CLI's run, now the oldest, is past
  // the first page.
  await page.waitForSelector(`#runs-table tbody tr[data-run="${newest}"]`);
  const firstRow = await page.$eval("#runs-table tbody tr", (r) => r.dataset.run);
  if (firstRow !== newest) throw new Error(`the newest run is not first: ${firstRow}`);
  if (await page.$(`#runs-table tr[data-run="${run}"]`)) throw new Error("the oldest run is on the first page");
  await page.waitForSelector("#runs-more:not([hidden])");
  await page.click("#runs-more");
  await page.waitForSelector(`#runs-table tr[data-run="${run}"]`);
  await page.waitForSelector("#runs-more[hidden]", { state: "attached" });
  const rows = () => page.$$eval("#runs-table tbody tr[data-run]", (rs) => rs.map((r) => r.dataset.run));
  const listed = await rows();
  if (listed.length !== 61) throw new Error(`${listed.length} runs listed after More, not 61`);
  await page.screenshot({ path: `${shots}/07-runs-more.png`, fullPage: true });
  // A run started meanwhile: the live refresh keeps as many rows as were shown (it does not
  // fold the list back to one page), the new run first and the oldest pushed to the next page.
  say("WANT_RUNS 1");
  const newer = (await nextLine()).trim();
  await page.waitForSelector(`#runs-table tbody tr[data-run="${newer}"]`);
  await page.waitForSelector("#runs-more:not([hidden])");
  const refreshed = await rows();
  if (refreshed.length !== 61 || refreshed[0] !== newer || refreshed.includes(run)) {
    throw new Error("the refreshed list: " + JSON.stringify([refreshed.length, refreshed[0], refreshed.includes(run)]));
  }
  await page.click("nav a[data-view=charts]");
  await page.waitForTimeout(2500);
  await page.screenshot({ path: `${shots}/08-charts.png`, fullPage: true });

  step("drain this Host and watch the session move");
  await page.click("nav a[data-view=hosts]");
  await page.waitForSelector("#drain");
  await page.click("#drain");
  await page.waitForSelector("#drain-report", { state: "visible" });
  const report = await page.textContent("#drain-report");
  say("DRAINED " + JSON.stringify(JSON.parse(report)));
  const moved = (await nextLine()).trim();
  if (moved !== "MOVED") throw new Error("unexpected line " + moved);
  // The other Host now holds the session; the page hears of it without a reload.
  await page.waitForFunction(() => {
    const rows = [...document.querySelectorAll("#hosts-table tr[data-host]")];
    const other = rows.find((r) => !r.children[0].textContent.includes("(this)"));
    const me = rows.find((r) => r.children[0].textContent.includes("(this)"));
    return other && other.children[5].textContent === "1" && me && me.children[4].textContent.includes("draining") &&
      me.children[4].textContent.includes("asked by operator:admin");
  });
  await page.screenshot({ path: `${shots}/09-hosts-after-drain.png`, fullPage: true });

  step("a narrow screen");
  await page.setViewportSize({ width: 390, height: 800 });
  await page.click("nav a[data-view=sessions]");
  await page.waitForSelector(`#sessions-table tr[data-session="${session}"]`);
  const overflow = await page.evaluate(() => document.documentElement.scrollWidth - window.innerWidth);
  if (overflow > 1) throw new Error(`the page is ${overflow}px wider than a 390px screen`);
  await page.screenshot({ path: `${shots}/10-narrow-sessions.png`, fullPage: true });

  if (errors.length) throw new Error("errors in the page:\n" + errors.join("\n"));
  say("DONE");
} catch (e) {
  process.stderr.write(String(e && e.stack ? e.stack : e) + "\n");
  if (errors.length) process.stderr.write(errors.join("\n") + "\n");
  await browser.close();
  process.exit(1);
}
await browser.close();
process.exit(0);
