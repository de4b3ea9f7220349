// Runs the published TypeScript port (@aws-lambda-powertools/idempotency) once against a
// Redis server through its CachePersistenceLayer and @redis/client, for
// tests/test_redis_typescript_interop.py.
//
// Input: one JSON object on stdin:
//   url                        redis://host:port of the test's redis-server
//   payload                    the idempotent function's first argument
//   response                   what the function returns when it runs (undefined: nothing)
//   keyPrefix                  makeIdempotent's keyPrefix option
//   eventKeyJmesPath           IdempotencyConfig.eventKeyJmesPath ("" hashes the whole payload)
//   payloadValidationJmesPath  optional
//   hashFunction               optional, default md5
//   lambdaContext              true: call it as a Lambda handler (writes in_progress_expiration)
//   mode                       "run" (default) or "claim": only write the port's INPROGRESS
//                              record, as a crashed function would leave it
//
// Output: one JSON object on stdout:
//   {"ran": bool, "returned": bool, "result": <value or null>,
//    "error": null | {name, message, cause?}}

import { createClient } from '@redis/client';
import { IdempotencyConfig, makeIdempotent } from '@aws-lambda-powertools/idempotency';
import { CachePersistenceLayer } from '@aws-lambda-powertools/idempotency/cache';

const readStdin = async () => {
  const chunks = [];
  for await (const chunk of process.stdin) chunks.push(chunk);
  return JSON.parse(Buffer.concat(chunks).toString('utf8'));
};

const input = await readStdin();
const client = await createClient({ url: input.url }).connect();
const persistenceStore = new CachePersistenceLayer({ client });
const config = new IdempotencyConfig({
  eventKeyJmesPath: input.eventKeyJmesPath ?? '',
  payloadValidationJmesPath: input.payloadValidationJmesPath ?? undefined,
  hashFunction: input.hashFunction ?? 'md5',
});
const options = { persistenceStore, config, keyPrefix: input.keyPrefix };
const output = { ran: false, returned: false, result: null, error: null };

try {
  if (input.mode === 'claim') {
    // What makeIdempotent does before it calls the function (IdempotencyHandler).
    persistenceStore.configure({ config, keyPrefix: options.keyPrefix });
    await persistenceStore.saveInProgress(input.payload, input.lambdaContext ? 30_000 : undefined);
  } else {
    const work = async (payload) => {
      output.ran = true;
      return input.response;
    };
    const idempotent = makeIdempotent(work, options);
    let result;
    if (input.lambdaContext) {
      const context = {
        functionName: 'interop',
        awsRequestId: 'interop-request',
        getRemainingTimeInMillis: () => 30_000,
      };
      result = await idempotent(input.payload, context);
    } else {
      result = await idempotent(input.payload);
    }
    output.returned = true;
    output.result = result === undefined ? null : result;
  }
} catch (error) {
  output.error = { name: error?.name ?? String(error), message: error?.message ?? '' };
  if (error?.cause) output.error.cause = String(error.cause);
}

await client.quit();
process.stdout.write(`${JSON.stringify(output)}\n`, () => process.exit(0));
