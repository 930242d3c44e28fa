// Shared by the SDK checks: a step that prints OK or FAIL with what came
// back, and the count of failures for the exit status.
export let failures = 0;

export async function step(name, fn) {
  try {
    const out = await fn();
    console.log(`OK   ${name}: ${JSON.stringify(out).slice(0, 200)}`);
  } catch (e) {
    failures++;
    console.log(`FAIL ${name}: ${e.status ?? ''} ${e.message}`.slice(0, 600));
  }
}

export function done(what) {
  console.log(failures ? `${what}: ${failures} FAILED` : `${what}: all OK`);
  process.exitCode = failures ? 1 : 0;
}

export const baseURL = `http://127.0.0.1:${process.env.PORT || 8097}/v1`;
