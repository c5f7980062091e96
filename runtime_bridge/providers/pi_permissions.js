// amux's permission gate for Pi under the "ask" policy, loaded with `pi --extension`.
//
// Pi has no permission system of its own, but its extensions see every tool call before it runs
// (`tool_call`) and may block it with a reason the model is told. Before each call that could
// change something, this asks the amux worker over the Unix socket named by AMUX_APPROVAL_SOCKET:
// one JSON line out, `{"tool": <name>, "input": <arguments>}`, one JSON line back,
// `{"allow": <bool>, "message": <text>}`. The worker decides which calls need a person; anything
// short of a clear "allow" (no socket, a closed connection, an unreadable answer) blocks the call.

import { closeSync, constants, openSync } from "node:fs";
import { createConnection } from "node:net";
import { basename, dirname } from "node:path";

const SOCKET_ENV = "AMUX_APPROVAL_SOCKET";
// Pi's own tools that only read: they run without a round trip to the worker.
const READ_TOOLS = new Set(["read", "grep", "find", "ls"]);
// A longer answer is not one the worker sends.
const MAX_ANSWER_CHARS = 1 << 20;

function denial(message) {
  return { allow: false, message };
}

function parseAnswer(line) {
  let answer;
  try {
    answer = JSON.parse(line);
  } catch {
    return denial("amux gave no answer to this permission request");
  }
  if (answer === null || typeof answer !== "object" || typeof answer.allow !== "boolean") {
    return denial("amux gave no answer to this permission request");
  }
  return { allow: answer.allow === true, message: String(answer.message ?? "") };
}

// A Unix socket's address holds at most 107 bytes; a deep run directory's socket is reached
// through a descriptor of its directory instead.
const MAX_SOCKET_ADDRESS = 100;

const O_PATH = 0o10000000;

function ask(path, tool, input) {
  return new Promise((resolve) => {
    let settled = false;
    let buffer = "";
    let directory = null;
    let address = path;
    if (Buffer.byteLength(path) > MAX_SOCKET_ADDRESS) {
      // O_PATH: the run directory is the worker's (mode 0711), which the Agent may pass
      // through but not open for reading. Node does not name the flag; Linux's value is fixed.
      directory = openSync(dirname(path), O_PATH | constants.O_DIRECTORY);
      address = `/proc/self/fd/${directory}/${basename(path)}`;
    }
    const socket = createConnection(address);
    const finish = (answer) => {
      if (settled) return;
      settled = true;
      socket.destroy();
      if (directory !== null) closeSync(directory);
      resolve(answer);
    };
    socket.setEncoding("utf8");
    socket.on("connect", () => {
      socket.write(`${JSON.stringify({ tool, input: input ?? {} })}\n`);
    });
    socket.on("data", (chunk) => {
      buffer += chunk;
      const end = buffer.indexOf("\n");
      if (end >= 0) finish(parseAnswer(buffer.slice(0, end)));
      else if (buffer.length > MAX_ANSWER_CHARS) finish(denial("amux sent an unreadable answer"));
    });
    socket.on("error", (error) => {
      finish(denial(`amux could not be asked for permission (${error.code ?? error.message})`));
    });
    // A connection closed before a whole line: what arrived is all there is.
    socket.on("close", () => finish(parseAnswer(buffer)));
  });
}

export default function amuxPermissions(pi) {
  pi.on("tool_call", async (event) => {
    if (READ_TOOLS.has(event.toolName)) return undefined;
    const path = process.env[SOCKET_ENV];
    if (!path) {
      return { block: true, reason: "amux could not be asked for permission (no socket)" };
    }
    let answer;
    try {
      answer = await ask(path, event.toolName, event.input);
    } catch (error) {
      answer = denial(`amux could not be asked for permission (${error?.message ?? error})`);
    }
    if (answer.allow) return undefined;
    return { block: true, reason: answer.message || "Permission was denied." };
  });
}
