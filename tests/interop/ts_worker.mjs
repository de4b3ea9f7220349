// Runs the published TypeScript port (@aws-lambda-powertools/idempotency) once against a
// DynamoDB endpoint, for tests/test_typescript_interop.py.
//
// Input: one JSON object on stdin:
//   endpoint, table            where the records live (the test's moto server and table)
//   payload                    the idempotent function's first argument
//   response                   what the function returns when it runs (undefined: nothing)
//   keyPrefix                  makeIdempotent's keyPrefix option (null/absent: not passed,
//                              the port then uses AWS_LAMBDA_FUNCTION_NAME from the env)
//   eventKeyJmesPath           IdempotencyConfig.eventKeyJmesPath ("" hashes the whole payload)
//   payloadValidationJmesPath  optional
//   hashFunction               optional, default md5
//   lambdaContext              true: call the function as a Lambda handler (event, context)
//                              so the port registers the remaining time and writes
//                              in_progress_expiration
//   mode                       "run" (default): call the idempotent function once;
//                              "claim": only write the port's INPROGRESS record
//                              (persistenceStore.saveInProgress), as a crashed function
//                              would leave it
//
// Output: one JSON object on stdout:
//   {"ran": bool, "returned": bool, "result": <value or null>,
//    "error": null | {name, message, cause?}}
//   (a BigInt in the result is written as {"$bigint": "<digits>"})
// Credentials and region come from the environment the test passes (dummy values).

import { IdempotencyConfig, makeIdempotent } from '@aws-lambda-powertools/idempotency';
import { DynamoDBPersistenceLayer } from '@aws-lambda-powertools/idempotency/dynamodb';

const readStdin = async () => {
  const chunks = [];
  for await (const chunk of process.stdin) chunks.push(chunk);
  return JSON.parse(Buffer.concat(chunks).toString('utf8'));
};

const input = await readStdin();

const persistenceStore = new DynamoDBPersistenceLayer({
  tableName: input.table,
  clientConfig: {
    endpoint: input.endpoint,
    region: process.env.AWS_REGION,
    credentials: {
      accessKeyId: process.env.AWS_ACCESS_KEY_ID,
      secretAccessKey: process.env.AWS_SECRET_ACCESS_KEY,
    },
    maxAttempts: 2,
  },
});

const config = new IdempotencyConfig({
  eventKeyJmesPath: input.eventKeyJmesPath ?? '',
  payloadValidationJmesPath: input.payloadValidationJmesPath ?? undefined,
  hashFunction: input.hashFunction ?? 'md5',
});

const options = { persistenceStore, config };
if (input.keyPrefix !== undefined && input.keyPrefix !== null) {
  options.keyPrefix = input.keyPrefix;
}

const output = { ran: false, returned: false, result: null, error: null };

try {
  if (input.mode === 'claim') {
    // What makeIdempotent does before it calls the function (IdempotencyHandler).
    persistenceStore.configure({ config, keyPrefix: options.keyPrefix });
    await persistenceStore.saveInProgress(input.payload);
  } else {
    const work = async (payload) => {
      output.ran = true;
      return input.response;
    };
    const idempotent = makeIdempotent(work, options);
    let result;
    if (input.lambdaContext) {
      const context = {
        functionName: process.env.AWS_LAMBDA_FUNCTION_NAME ?? 'interop',
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

// unmarshall returns a BigInt for an integer beyond 2**53-1; JSON has no such type, so
// it is written as {"$bigint": "<digits>"}.
const encode = (_key, value) =>
  typeof value === 'bigint' ? { $bigint: value.toString() } : value;

// Exit once the line is flushed: the SDK's keep-alive sockets must not hold the process.
process.stdout.write(`${JSON.stringify(output, encode)}\n`, () => process.exit(0));
