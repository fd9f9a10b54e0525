// A real OpenID Connect provider for Lazarus's single sign-on tests: npm's oidc-provider (a
// certified implementation) with a login page of its own, users and groups from a JSON file.
//
//   node provider.js CONFIG.json
//
// CONFIG: {"port": 8999, "issuer": "http://127.0.0.1:8999", "clients": [...],
//          "usersFile": "users.json", "keyId": "k1", "idTokenTtlSeconds": 3600,
//          "clockOffsetSeconds": 0, "publishOtherKey": false, "allowLocalRedirects": true,
//          "conformIdTokenClaims": false}
// conformIdTokenClaims: true puts the profile and groups claims in the userinfo answer only
// (as providers that keep id tokens small do); false puts them in the id token too.
// usersFile: {"alice": {"password": "...", "groups": ["..."]}, ...}, read at every sign-in (a
// test changes someone's groups by rewriting it); a user without "groups" gets no groups claim.
// The login name is the subject (sub); "preferred_username" and "email" default to it and to
// <login>@example.test (a user may set them, as providers whose users edit their profile do);
// "email_verified" is sent only when the user has it.
// allowLocalRedirects: any http://testserver, localhost or 127.0.0.1 port may be a redirect URI
// (/sso/callback) or a post-logout redirect URI (/login/): the tests' servers have random ports.
// Once it listens it prints one line, "listening <issuer> <port>", on stdout.
//
// Test-only switches, each a way a real deployment goes wrong:
//   clockOffsetSeconds  the provider's clock runs this far ahead (negative: behind), so the
//                       tokens it signs have skewed iat/exp;
//   publishOtherKey     it signs with one key but publishes another under the same key id (a
//                       token signed with a key the issuer does not vouch for).
import { generateKeyPairSync } from 'node:crypto';
import { readFileSync } from 'node:fs';

const config = JSON.parse(readFileSync(process.argv[2], 'utf8'));

const offsetMs = (config.clockOffsetSeconds || 0) * 1000;
if (offsetMs) {
  const realNow = Date.now;
  Date.now = () => realNow() + offsetMs;
}

const { default: Provider } = await import('oidc-provider');

function rsaKey(kid) {
  const { privateKey } = generateKeyPairSync('rsa', { modulusLength: 2048 });
  return { ...privateKey.export({ format: 'jwk' }), kid, use: 'sig', alg: 'RS256' };
}

const keyId = config.keyId || 'test-key';
const signingKey = rsaKey(keyId);
const publishedKey = config.publishOtherKey ? rsaKey(keyId) : signingKey;
const publicPart = ({ kty, n, e, kid, use, alg }) => ({ kty, n, e, kid, use, alg });

function users() {
  return JSON.parse(readFileSync(config.usersFile, 'utf8'));
}

function escape(text) {
  return String(text).replace(/[&<>"']/g, (c) => `&#${c.charCodeAt(0)};`);
}

function page(title, body) {
  return `<!DOCTYPE html><html><head><meta charset="utf-8"><title>${escape(title)}</title></head>`
    + `<body><h1>${escape(title)}</h1>${body}</body></html>`;
}

const provider = new Provider(config.issuer, {
  clients: config.clients,
  jwks: { keys: [signingKey] },
  pkce: { required: () => true },
  ttl: { IdToken: config.idTokenTtlSeconds || 3600 },
  conformIdTokenClaims: config.conformIdTokenClaims ?? false,
  claims: {
    openid: ['sub'],
    profile: ['preferred_username', 'name'],
    email: ['email', 'email_verified'],
    groups: ['groups'],
  },
  scopes: ['openid', 'offline_access', 'profile', 'email', 'groups'],
  cookies: { keys: ['lazarus-test-provider-cookie-key'] },
  features: {
    devInteractions: { enabled: false },
    rpInitiatedLogout: {
      enabled: true,
      async logoutSource(ctx, form) {
        ctx.body = page('Sign out of the test provider?', `${form}`
          + '<button type="submit" form="op.logoutForm" value="yes" name="logout">Yes, sign me out</button>');
      },
      async postLogoutSuccessSource(ctx) {
        ctx.body = page('Signed out', '<p>You are signed out of the test provider.</p>');
      },
    },
  },
  interactions: { url: (ctx, interaction) => `/interaction/${interaction.uid}` },
  async findAccount(ctx, id) {
    const user = users()[id];
    if (!user) return undefined;
    return {
      accountId: id,
      async claims() {
        const claims = {
          sub: id,
          preferred_username: user.preferred_username ?? id,
          name: user.name || id,
          email: user.email ?? `${id}@example.test`,
        };
        if (user.email_verified !== undefined) claims.email_verified = user.email_verified;
        if (user.groups !== undefined) claims.groups = user.groups;
        return claims;
      },
    };
  },
  // First-party client: no consent screen (the grant covers what the client asked for).
  async loadExistingGrant(ctx) {
    const grantId = ctx.oidc.result?.consent?.grantId
      || ctx.oidc.session.grantIdFor(ctx.oidc.client.clientId);
    if (grantId) return ctx.oidc.provider.Grant.find(grantId);
    const grant = new ctx.oidc.provider.Grant({
      clientId: ctx.oidc.client.clientId,
      accountId: ctx.oidc.session.accountId,
    });
    grant.addOIDCScope(ctx.oidc.requestParamScopes ? [...ctx.oidc.requestParamScopes].join(' ') : 'openid');
    grant.addOIDCClaims(['preferred_username', 'name', 'email', 'email_verified', 'groups']);
    await grant.save();
    return grant;
  },
});

if (config.allowLocalRedirects) {
  const local = '^http://(testserver|localhost:\\d+|127\\.0\\.0\\.1:\\d+)';
  const allowed = new RegExp(`${local}/sso/callback$`);
  const allowedAfterLogout = new RegExp(`${local}/login/(\\?.*)?$`);
  const { prototype } = provider.Client;
  const redirectUriAllowed = prototype.redirectUriAllowed;
  const postLogoutRedirectUriAllowed = prototype.postLogoutRedirectUriAllowed;
  prototype.redirectUriAllowed = function (value) {
    return allowed.test(value) || redirectUriAllowed.call(this, value);
  };
  prototype.postLogoutRedirectUriAllowed = function (value) {
    return allowedAfterLogout.test(value)
      || postLogoutRedirectUriAllowed.call(this, value);
  };
}

async function readForm(req) {
  const chunks = [];
  for await (const chunk of req) chunks.push(chunk);
  return new URLSearchParams(Buffer.concat(chunks).toString('utf8'));
}

provider.use(async (ctx, next) => {
  if (config.publishOtherKey && ctx.method === 'GET' && ctx.path === '/jwks') {
    ctx.type = 'application/jwk-set+json';
    ctx.body = { keys: [publicPart(publishedKey)] };
    return;
  }
  const match = ctx.path.match(/^\/interaction\/([^/]+)$/);
  if (!match) {
    await next();
    return;
  }
  const details = await provider.interactionDetails(ctx.req, ctx.res);
  if (details.prompt.name !== 'login') {
    // Consent is granted by loadExistingGrant; any other prompt is finished as is.
    await provider.interactionFinished(ctx.req, ctx.res, {}, { mergeWithLastSubmission: true });
    ctx.respond = false;
    return;
  }
  let error = '';
  if (ctx.method === 'POST') {
    const form = await readForm(ctx.req);
    const login = form.get('login') || '';
    const user = users()[login];
    if (user && user.password === form.get('password')) {
      await provider.interactionFinished(ctx.req, ctx.res, { login: { accountId: login } },
        { mergeWithLastSubmission: false });
      ctx.respond = false;
      return;
    }
    error = '<p class="error" id="provider-error">Invalid username or password.</p>';
  }
  ctx.type = 'html';
  ctx.body = page('Sign in to the test provider', `${error}`
    + `<form method="post" action="/interaction/${escape(details.uid)}">`
    + '<label>Username <input name="login" autofocus></label>'
    + '<label>Password <input name="password" type="password"></label>'
    + '<button type="submit" id="provider-submit">Sign in</button></form>');
});

const server = provider.listen(config.port || 0, '127.0.0.1', () => {
  const { port } = server.address();
  process.stdout.write(`listening ${config.issuer} ${port}\n`);
});
