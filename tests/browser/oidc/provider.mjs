// An OpenID provider on loopback for the single sign-on browser test.
//
// The certified `oidc-provider` package with its own login and consent pages
// (devInteractions: any password is accepted; the login names the account).
// One confidential client, authorization-code flow, PKCE (S256) required.
// Accounts and their groups are read from ACCOUNTS_FILE at every sign-in, so
// a test can change someone's groups between two logins.
//
//   PORT=9000 CLIENT_ID=qm CLIENT_SECRET=s REDIRECT_URI=http://127.0.0.1:8000/oidc/callback/ \
//   ACCOUNTS_FILE=accounts.json node provider.mjs
//
// It prints "listening <issuer>" once it accepts connections.
import { readFileSync } from 'node:fs';

import Provider from 'oidc-provider';

const env = (name) => {
  const value = process.env[name];
  if (!value) {
    console.error(`provider.mjs: set ${name}`);
    process.exit(2);
  }
  return value;
};

const port = Number(env('PORT'));
const issuer = `http://127.0.0.1:${port}`;
const accountsFile = env('ACCOUNTS_FILE');

function account(login) {
  const accounts = JSON.parse(readFileSync(accountsFile, 'utf8'));
  const known = accounts[login];
  if (!known) return undefined;
  return {
    accountId: login,
    async claims() {
      return {
        sub: login,
        preferred_username: login,
        email: known.email ?? `${login}@example.com`,
        email_verified: true,
        name: known.name ?? login,
        groups: known.groups ?? [],
      };
    },
  };
}

const provider = new Provider(issuer, {
  clients: [
    {
      client_id: env('CLIENT_ID'),
      client_secret: env('CLIENT_SECRET'),
      redirect_uris: [env('REDIRECT_URI')],
      grant_types: ['authorization_code'],
      response_types: ['code'],
      token_endpoint_auth_method: 'client_secret_post',
      id_token_signed_response_alg: 'RS256',
    },
  ],
  claims: {
    openid: ['sub'],
    email: ['email', 'email_verified'],
    profile: ['name', 'preferred_username'],
    groups: ['groups'],
  },
  scopes: ['openid', 'email', 'profile', 'groups'],
  // Every client must prove the code with a verifier, confidential ones included.
  pkce: { required: () => true },
  async findAccount(_ctx, id) {
    return account(id);
  },
});
// Plain HTTP on loopback: tell the provider that is the real scheme.
provider.proxy = true;

provider.listen(port, '127.0.0.1', () => {
  console.log(`listening ${issuer}`);
});
